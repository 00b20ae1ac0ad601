// SentencePiece-style (llama.cpp "llama" model) tokenizer over a GGUF vocabulary.
// Encoding reproduces llama.cpp's llm_tokenizer_spm: optional space prefix, ' ' -> "▁", then repeated
// merging of the adjacent pair whose concatenation is the best-scoring vocabulary piece (ties: leftmost),
// and byte fallback (<0xXX> tokens) for symbols that are not pieces.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace fd {

class GgufFile;

// GGUF token types (tokenizer.ggml.token_type).
enum class TokenType : int32_t { normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };

struct Vocab {
  std::vector<std::string> pieces;  // [n_vocab] "▁" (U+2581) stands for a space
  std::vector<float> scores;        // [n_vocab] merge priority, higher first
  std::vector<TokenType> types;     // [n_vocab]
  int32_t bos = 1;
  int32_t eos = 2;
  int32_t unk = 0;
  bool add_bos = true;
  bool add_space_prefix = true;
  int size() const { return static_cast<int>(pieces.size()); }
};

// Reads tokenizer.ggml.* from a GGUF file; requires tokenizer.ggml.model == "llama".
Vocab load_vocab(const GgufFile& file);

// A synthetic vocabulary of exactly n tokens (n >= 259): <unk>, <s>, </s>, 256 byte tokens, then
// printable pieces; used by random-weight models.
Vocab make_synthetic_vocab(int n);

class Tokenizer {
 public:
  explicit Tokenizer(const Vocab& vocab);
  // Token ids of text; BOS first when add_bos.
  std::vector<int32_t> encode(const std::string& text, bool add_bos) const;
  // The bytes one token stands for. When the vocabulary adds a space prefix and prev is BOS or
  // negative (id is the first token), one leading space is removed, as llama.cpp and llama2.c do.
  // Throws fd::Error for an id outside the vocabulary.
  std::string piece(int32_t prev, int32_t id) const;
  // Concatenated piece(previous id or -1, id) of ids (BOS/EOS, control and unknown tokens print
  // nothing).
  std::string decode(const std::vector<int32_t>& ids) const;
  const Vocab& vocab() const { return vocab_; }

 private:
  Vocab vocab_;  // a copy, so the tokenizer does not depend on the lifetime of the caller's Vocab
  std::unordered_map<std::string, int32_t> index_;
  int32_t byte_ids_[256];             // token that encodes each byte value
  std::vector<int16_t> byte_values_;  // [n_vocab] the byte a byte token stands for, -1 for others
};

}  // namespace fd
