#include "runtime/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <queue>
#include <unordered_set>

#include "runtime/error.h"
#include "runtime/gguf.h"

namespace fd {
namespace {

constexpr char kSpaceMark[] = "\xe2\x96\x81";  // "▁" (U+2581), SentencePiece's visible space
constexpr size_t kSpaceMarkLen = 3;

// Length of the UTF-8 sequence a lead byte starts, by its high nibble; stray continuation bytes
// count as one-byte characters, exactly as llama.cpp's unicode_len_utf8.
size_t utf8_len(unsigned char lead) {
  constexpr size_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

std::string byte_piece(int b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "<0x%02X>", b);
  return buf;
}

// The byte of a "<0xXX>" piece, or -1 when the text has another form.
int parse_byte_piece(const std::string& s) {
  if (s.size() != 6 || s.compare(0, 3, "<0x") != 0 || s[5] != '>') return -1;
  int v = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = s[i];
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return -1;
    }
    v = v * 16 + d;
  }
  return v;
}

// A run of text in the symbol chain; merged-away symbols have n == 0.
struct Symbol {
  int prev;
  int next;
  size_t offset;  // bytes into the escaped text
  size_t n;       // bytes
};

struct Bigram {
  int left;
  int right;
  float score;
  size_t size;  // bytes of the concatenation, to detect entries made stale by later merges
};

// Max-heap order: best score first, then the leftmost pair.
struct BigramOrder {
  bool operator()(const Bigram& l, const Bigram& r) const {
    return l.score < r.score || (l.score == r.score && l.left > r.left);
  }
};

}  // namespace

Vocab load_vocab(const GgufFile& file) {
  const std::string model = file.get_string("tokenizer.ggml.model");
  if (model != "llama") {
    throw Error(file.path() + ": tokenizer model '" + model +
                "' is not supported; only the SentencePiece 'llama' tokenizer is.");
  }
  Vocab v;
  v.pieces = file.get_strings("tokenizer.ggml.tokens");
  const size_t n = v.pieces.size();
  if (n == 0) throw Error(file.path() + ": tokenizer.ggml.tokens is empty.");

  if (file.has("tokenizer.ggml.scores")) {
    const std::vector<double> scores = file.get_floats("tokenizer.ggml.scores");
    if (scores.size() != n) {
      throw Error(file.path() + ": tokenizer.ggml.scores has " + std::to_string(scores.size()) +
                  " entries for " + std::to_string(n) + " tokens.");
    }
    v.scores.assign(scores.begin(), scores.end());
  } else {
    v.scores.assign(n, 0.0f);
  }

  if (file.has("tokenizer.ggml.token_type")) {
    const std::vector<int64_t> types = file.get_ints("tokenizer.ggml.token_type");
    if (types.size() != n) {
      throw Error(file.path() + ": tokenizer.ggml.token_type has " + std::to_string(types.size()) +
                  " entries for " + std::to_string(n) + " tokens.");
    }
    v.types.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const int64_t t = types[i];
      if (t < static_cast<int64_t>(TokenType::normal) || t > static_cast<int64_t>(TokenType::byte)) {
        throw Error(file.path() + ": token " + std::to_string(i) + " has the unknown token type " +
                    std::to_string(t) + ".");
      }
      v.types.push_back(static_cast<TokenType>(t));
    }
  } else {
    v.types.assign(n, TokenType::normal);
  }

  const auto special_id = [&](const char* key, int64_t fallback) {
    const int64_t id = file.get_int(key, fallback);
    if (id < 0 || id >= static_cast<int64_t>(n)) {
      throw Error(file.path() + ": " + key + " is " + std::to_string(id) + ", outside the vocabulary of " +
                  std::to_string(n) + " tokens.");
    }
    return static_cast<int32_t>(id);
  };
  v.bos = special_id("tokenizer.ggml.bos_token_id", 1);
  v.eos = special_id("tokenizer.ggml.eos_token_id", 2);
  v.unk = special_id("tokenizer.ggml.unknown_token_id", 0);
  v.add_bos = file.get_bool("tokenizer.ggml.add_bos_token", true);
  v.add_space_prefix = file.get_bool("tokenizer.ggml.add_space_prefix", true);
  for (size_t i = 0; i < n; ++i) {
    if (v.types[i] == TokenType::byte && parse_byte_piece(v.pieces[i]) < 0) {
      throw Error(file.path() + ": byte token " + std::to_string(i) + " has the text '" + v.pieces[i] +
                  "' instead of the form <0xXX>.");
    }
  }
  return v;
}

Vocab make_synthetic_vocab(int n) {
  if (n < 259) {
    throw Error("A synthetic vocabulary needs at least 259 tokens (<unk>, <s>, </s> and 256 byte tokens), "
                "not " +
                std::to_string(n) + ".");
  }
  Vocab v;
  v.pieces.reserve(static_cast<size_t>(n));
  v.scores.reserve(static_cast<size_t>(n));
  v.types.reserve(static_cast<size_t>(n));
  const auto add = [&](std::string p, TokenType type, float score) {
    v.pieces.push_back(std::move(p));
    v.types.push_back(type);
    v.scores.push_back(score);
  };
  add("<unk>", TokenType::unknown, 0.0f);
  add("<s>", TokenType::control, 0.0f);
  add("</s>", TokenType::control, 0.0f);
  for (int b = 0; b < 256; ++b) add(byte_piece(b), TokenType::byte, 0.0f);

  // Normal pieces, best score first. Every multi-character piece is added after the piece one
  // character shorter, so each is reachable by merging that prefix with its last character.
  std::unordered_set<std::string> seen;
  const std::string mark(kSpaceMark, kSpaceMarkLen);
  const auto add_normal = [&](const std::string& p) {
    if (v.size() < n && seen.insert(p).second) add(p, TokenType::normal, -static_cast<float>(seen.size()));
  };
  const auto add_word = [&](const std::string& w, bool space) {
    for (size_t k = 1; k <= w.size(); ++k) add_normal((space ? mark : std::string()) + w.substr(0, k));
  };
  add_normal(mark);
  for (char c = 'a'; c <= 'z'; ++c) add_normal(std::string(1, c));
  for (char c = 'a'; c <= 'z'; ++c) add_normal(mark + c);
  for (char c = 'A'; c <= 'Z'; ++c) add_normal(std::string(1, c));
  for (char c = '0'; c <= '9'; ++c) add_normal(std::string(1, c));
  for (char c = '!'; c <= '~'; ++c) add_normal(std::string(1, c));
  for (char c = 'A'; c <= 'Z'; ++c) add_normal(mark + c);
  for (const char* w : {"th", "he", "in", "er", "an", "re", "on", "at", "en", "nd", "ti", "es", "or", "te",
                        "of", "ed", "is", "it", "al", "ar", "st", "to", "nt", "ng", "se", "ha", "as", "ou",
                        "io", "le", "ve", "co", "me", "de", "hi", "ri", "ro", "ic", "ne", "ea", "ra", "ce",
                        "ing", "ion", "ent", "and", "the", "her", "ere", "tio"}) {
    add_word(w, false);
  }
  for (const char* w : {"the", "and", "to", "of", "in", "is", "it", "that", "was", "for", "on", "with",
                        "he", "she", "they", "you", "we", "be", "at", "as", "have", "this", "from", "one",
                        "had", "by", "but", "not", "what", "all", "were", "when", "there", "can", "said",
                        "time", "day", "once", "upon", "little", "big", "play", "happy", "friend"}) {
    add_word(w, true);
  }
  // Fill up with all lowercase strings of growing length, with and without a leading space mark.
  for (size_t len = 2; v.size() < n; ++len) {
    std::string w(len, 'a');
    for (bool done = false; !done && v.size() < n;) {
      add_normal(mark + w);
      add_normal(w);
      size_t i = len;
      while (i > 0 && w[i - 1] == 'z') w[--i] = 'a';
      if (i == 0) {
        done = true;
      } else {
        ++w[i - 1];
      }
    }
  }
  return v;
}

Tokenizer::Tokenizer(const Vocab& vocab) : vocab_(vocab) {
  const int n = vocab_.size();
  if (n == 0) throw Error("The tokenizer vocabulary is empty.");
  if (static_cast<int>(vocab_.scores.size()) != n || static_cast<int>(vocab_.types.size()) != n) {
    throw Error("The tokenizer vocabulary has " + std::to_string(n) + " pieces but " +
                std::to_string(vocab_.scores.size()) + " scores and " +
                std::to_string(vocab_.types.size()) + " token types.");
  }
  for (const auto& [name, id] : {std::pair<const char*, int32_t>{"BOS", vocab_.bos},
                                 {"EOS", vocab_.eos},
                                 {"unknown", vocab_.unk}}) {
    if (id < 0 || id >= n) {
      throw Error(std::string("The tokenizer's ") + name + " token id " + std::to_string(id) +
                  " is outside its vocabulary of " + std::to_string(n) + " tokens.");
    }
  }
  index_.reserve(static_cast<size_t>(n));
  byte_values_.assign(static_cast<size_t>(n), -1);
  for (int32_t i = 0; i < n; ++i) {
    // Later duplicates win, as in llama.cpp's token_to_id.
    index_[vocab_.pieces[i]] = i;
    if (vocab_.types[i] == TokenType::byte) {
      const int b = parse_byte_piece(vocab_.pieces[i]);
      if (b < 0) {
        throw Error("Byte token " + std::to_string(i) + " of the tokenizer vocabulary has the text '" +
                    vocab_.pieces[i] + "' instead of the form <0xXX>.");
      }
      byte_values_[i] = static_cast<int16_t>(b);
    }
  }
  for (int b = 0; b < 256; ++b) {
    auto it = index_.find(byte_piece(b));
    if (it == index_.end()) it = index_.find(std::string(1, static_cast<char>(b)));
    byte_ids_[b] = it == index_.end() ? vocab_.unk : it->second;
  }
}

std::vector<int32_t> Tokenizer::encode(const std::string& text, bool add_bos) const {
  std::vector<int32_t> out;
  if (add_bos) out.push_back(vocab_.bos);
  if (text.empty()) return out;

  std::string s;
  s.reserve(text.size() * 2 + kSpaceMarkLen);
  if (vocab_.add_space_prefix) s.append(kSpaceMark, kSpaceMarkLen);
  for (char c : text) {
    if (c == ' ') {
      s.append(kSpaceMark, kSpaceMarkLen);
    } else {
      s.push_back(c);
    }
  }

  std::vector<Symbol> symbols;
  symbols.reserve(s.size());
  for (size_t off = 0; off < s.size();) {
    const size_t len = std::min(utf8_len(static_cast<unsigned char>(s[off])), s.size() - off);
    const int idx = static_cast<int>(symbols.size());
    symbols.push_back({idx - 1, off + len == s.size() ? -1 : idx + 1, off, len});
    off += len;
  }

  std::string key;  // reused lookup buffer
  auto lookup = [&](size_t offset, size_t n) -> int32_t {
    key.assign(s, offset, n);
    const auto it = index_.find(key);
    return it == index_.end() ? -1 : it->second;
  };

  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
  auto try_add_bigram = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const size_t size = symbols[left].n + symbols[right].n;
    const int32_t id = lookup(symbols[left].offset, size);
    if (id < 0) return;
    queue.push({left, right, vocab_.scores[id], size});
  };

  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) try_add_bigram(i - 1, i);

  while (!queue.empty()) {
    const Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[bigram.left];
    Symbol& right = symbols[bigram.right];
    if (left.n == 0 || right.n == 0 || left.n + right.n != bigram.size) continue;
    left.n += right.n;
    right.n = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = bigram.left;
    try_add_bigram(left.prev, bigram.left);
    try_add_bigram(bigram.left, left.next);
  }

  // Every merged symbol is a vocabulary piece; only unmerged characters can need byte fallback.
  for (int i = 0; i != -1; i = symbols[i].next) {
    const Symbol& sym = symbols[i];
    const int32_t id = lookup(sym.offset, sym.n);
    if (id >= 0) {
      out.push_back(id);
    } else {
      for (size_t j = 0; j < sym.n; ++j) {
        out.push_back(byte_ids_[static_cast<unsigned char>(s[sym.offset + j])]);
      }
    }
  }
  return out;
}

std::string Tokenizer::piece(int32_t prev, int32_t id) const {
  if (id < 0 || id >= vocab_.size()) {
    throw Error("Token id " + std::to_string(id) + " is outside the tokenizer vocabulary of " +
                std::to_string(vocab_.size()) + " tokens.");
  }
  std::string out;
  switch (vocab_.types[id]) {
    case TokenType::normal: {
      const std::string& p = vocab_.pieces[id];
      out.reserve(p.size());
      for (size_t i = 0; i < p.size();) {
        if (p.compare(i, kSpaceMarkLen, kSpaceMark) == 0) {
          out.push_back(' ');
          i += kSpaceMarkLen;
        } else {
          out.push_back(p[i++]);
        }
      }
      break;
    }
    case TokenType::user_defined:
      out = vocab_.pieces[id];
      break;
    case TokenType::byte:
      out.assign(1, static_cast<char>(byte_values_[id]));
      break;
    case TokenType::unknown:
    case TokenType::control:
    case TokenType::unused:
      break;
  }
  if (vocab_.add_space_prefix && (prev < 0 || prev == vocab_.bos) && !out.empty() && out[0] == ' ') {
    out.erase(0, 1);
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  int32_t prev = -1;
  for (int32_t id : ids) {
    out += piece(prev, id);
    prev = id;
  }
  return out;
}

}  // namespace fd
