// The gatekeeper lets through only peers with the cluster secret, the protocol version and,
// for shards, the current run.
#include <catch2/catch.hpp>

#include "actors/gatekeeper.h"
#include "actors/system.h"
#include "caf/all.hpp"

namespace {

fd::Model tiny_model() {
  fd::ModelConfig c;
  c.n_layers = 1;
  c.dim = 32;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 16;
  c.ff = 64;
  c.vocab = 300;
  c.ctx = 64;
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
  caf::actor_system_config cfg;
  fd::configure_caf(cfg, 2);
  caf::actor_system sys{cfg};
  fd::GpuNode node = fd::start_gpu_node(sys, model, fd::LocalOptions{});
  fd::GatekeeperConfig gc{"s3cret", 77, model->cfg, {fd::whole_model_group(model->cfg)}, 16};
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
