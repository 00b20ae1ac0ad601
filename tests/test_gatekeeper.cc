// The gatekeeper lets through only peers with the cluster secret, the protocol version and,
// for shards, the current run.
#include <catch2/catch.hpp>

#include "actors/gatekeeper.h"
#include "actors/system.h"
#include "pipeline_fixture.h"
#include "caf/all.hpp"
#include "tests/test_models.h"

namespace {

fd::Model tiny_model() {
  const fd::ModelConfig c =
      test_models::config(1, 32, 2, 1, 64, 300, 64);
  return fd::make_random_model(c, 3);
}

template <class Reply, class Msg>
std::string refusal_of(caf::actor_system& sys, caf::scoped_actor& self,
                       const fd::gatekeeper_actor& gate, Msg msg) {
  std::string err = "(accepted)";
  self->request(gate, std::chrono::seconds(5), msg)
      .receive([](Reply&) {}, [&](caf::error& e) { err = sys.render(e); });
  return err;
}

}  // namespace

TEST_CASE("same_secret compares whole strings", "[gatekeeper]") {
  CHECK(fd::same_secret("abc", "abc"));
  CHECK_FALSE(fd::same_secret("abc", "abd"));
  CHECK_FALSE(fd::same_secret("abc", "abcd"));
  CHECK_FALSE(fd::same_secret("", "a"));
  CHECK(fd::same_secret("", ""));
}

TEST_CASE("gatekeeper refuses wrong secrets, versions and runs", "[gatekeeper]") {
  auto model = std::make_shared<const fd::Model>(tiny_model());
  TestSystem actors;
  caf::actor_system& sys = actors.sys;
  fd::GpuNode node = fd::start_gpu_node(sys, model, fd::LocalOptions{});
  fd::GatekeeperConfig gc;
  gc.token = "s3cret";
  gc.run_id = 77;
  gc.model = model->cfg;
  gc.groups = {fd::whole_model_group(model->cfg)};
  gc.block_tokens = 16;
  gc.max_seqs = 48;
  auto gate = fd::spawn_gatekeeper(sys, gc, node.scheduler);
  caf::scoped_actor self{sys};
  CHECK(refusal_of<fd::join_reply>(sys, self, gate, fd::join_request{"wrong", fd::kProtocolVersion, "n"}).find("wrong cluster secret") !=
        std::string::npos);
  CHECK(refusal_of<fd::join_reply>(sys, self, gate, fd::join_request{"s3cret", fd::kProtocolVersion + 1, "n"}).find("protocol version") !=
        std::string::npos);
  CHECK(refusal_of<fd::scheduler_actor>(sys, self, gate, fd::client_hello{"", fd::kProtocolVersion}).find("wrong cluster secret") !=
        std::string::npos);

  fd::join_reply shape;
  self->request(gate, std::chrono::seconds(5), fd::join_request{"s3cret", fd::kProtocolVersion, "n"})
      .receive([&](fd::join_reply& r) { shape = r; }, [&](caf::error&) { FAIL("join refused"); });
  CHECK(shape.run_id == 77);
  CHECK(shape.n_layers == 1);
  CHECK(shape.head_dim == 16);
  CHECK(shape.max_seqs == 48);  // what a cpu node without --kv-memory sizes its KV-cache by
  CHECK(shape.seq_tokens == model->cfg.ctx);

  const auto& mc = model->cfg;
  auto shards = fd::spawn_shards(sys, "t", 1,
                                 fd::KvStoreConfig{mc.n_layers, mc.n_kv_heads, mc.head_dim, 16,
                                                   size_t(1) << 20},
                                 fd::kernels::AttnDims{mc.n_heads, mc.n_kv_heads, mc.head_dim});
  CHECK(refusal_of<fd::shard_ids>(sys, self, gate, fd::add_shards{"s3cret", 76, shards}).find("earlier run") != std::string::npos);
  CHECK(refusal_of<fd::shard_ids>(sys, self, gate, fd::add_shards{"bad", 77, shards}).find("wrong cluster secret") != std::string::npos);
  bool joined = false;
  self->request(gate, std::chrono::seconds(5), fd::add_shards{"s3cret", 77, shards})
      .receive([&](fd::shard_ids& ids) { joined = ids.ids.size() == 1; },
               [&](caf::error& e) { FAIL(sys.render(e)); });
  CHECK(joined);
  bool got_scheduler = false;
  self->request(gate, std::chrono::seconds(5), fd::client_hello{"s3cret", fd::kProtocolVersion})
      .receive([&](fd::scheduler_actor& s) { got_scheduler = s == node.scheduler; },
               [&](caf::error& e) { FAIL(sys.render(e)); });
  CHECK(got_scheduler);
  for (auto& s : shards) caf::anon_send_exit(s.hdl, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(gate, caf::exit_reason::user_shutdown);
  fd::stop_gpu_node(node);
}

namespace {

// attn_request as it was serialized before wire_payload: plain `bytes` fields.
struct plain_request {
  uint64_t step = 0;
  int32_t layer = 0;
  std::vector<fd::seq_rows> seqs;
  fd::bytes q, k, v;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, plain_request& x) {
  return f(caf::meta::type_name("attn_request"), x.step, x.layer, x.seqs, x.q, x.k, x.v);
}

fd::bytes pattern(size_t n, int seed) {
  fd::bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<char>((i * 131 + seed) >> 3);
  return b;
}

}  // namespace

TEST_CASE("tensor payloads keep the plain bytes wire format and round-trip", "[gatekeeper]") {
  // 5 MiB crosses the size from which buffers are reserved with the huge-page hint.
  for (size_t q_bytes : {size_t(0), size_t(4096), size_t(5) << 20}) {
    INFO("q of " << q_bytes << " bytes");
    fd::attn_request req;
    req.step = 7;
    req.layer = 3;
    req.seqs = {fd::seq_rows{11, 5, 2}, fd::seq_rows{12, 0, 9}};
    req.q = pattern(q_bytes, 1);
    req.k = pattern(q_bytes / 4 + 3, 2);
    req.v = pattern(q_bytes / 4 + 5, 3);
    plain_request plain{req.step, req.layer, req.seqs, req.q, req.k, req.v};

    std::vector<char> wire, plain_wire = {'h', 'd', 'r'};  // as after a BASP header
    wire = plain_wire;
    caf::binary_serializer sink{nullptr, wire};
    REQUIRE(!sink(req));
    caf::binary_serializer plain_sink{nullptr, plain_wire};
    REQUIRE(!plain_sink(plain));
    CHECK(wire == plain_wire);

    fd::attn_request back;
    back.q = pattern(100, 9);  // loading replaces whatever was there
    caf::binary_deserializer source{nullptr, wire.data() + 3, wire.size() - 3};
    REQUIRE(!source(back));
    CHECK(source.remaining() == 0);
    CHECK(back.step == req.step);
    CHECK(back.layer == req.layer);
    REQUIRE(back.seqs.size() == 2);
    CHECK(back.seqs[1].seq == 12);
    CHECK(back.seqs[1].n == 9);
    CHECK(back.q == req.q);
    CHECK(back.k == req.k);
    CHECK(back.v == req.v);

    fd::attn_request cut;  // a truncated message is an error, not a read past its end
    caf::binary_deserializer short_source{nullptr, wire.data() + 3, wire.size() - 4};
    CHECK(short_source(cut));

    fd::attn_reply reply;
    reply.o = pattern(q_bytes, 4);
    reply.compute_us = 42;
    std::vector<char> reply_wire;
    caf::binary_serializer reply_sink{nullptr, reply_wire};
    REQUIRE(!reply_sink(reply));
    fd::attn_reply reply_back;
    caf::binary_deserializer reply_source{nullptr, reply_wire};
    REQUIRE(!reply_source(reply_back));
    CHECK(reply_back.o == reply.o);
    CHECK(reply_back.compute_us == 42);
  }
}
