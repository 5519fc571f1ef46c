// Mixture-of-experts ops: the router on a hand-worked example (top-k, tie breaking, GShard slot
// order, capacity dropping, load, losses), its gradient by finite differences, and permute /
// unpermute against naive references and finite differences.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "backend_test_util.hpp"

using namespace backend_test;
using trainctl::backend::RouterArgs;
using trainctl::backend::stats_dtype;
using trainctl::tensor::dtype_name;

namespace {

// Owns every output of a router call over N tokens, E experts.
struct Router {
  OwnedTensor logits, probs, expert_idx, gates, slot, counts, load;
  RouterArgs args;
  Router(DType dtype, int64_t N, int64_t E, int64_t k, int64_t capacity, const Values& values)
      : logits(make(dtype, Shape{N, E}, values)),
        probs(stats_dtype(dtype), Shape{N, E}),
        expert_idx(DType::i32, Shape{N, k}),
        gates(stats_dtype(dtype), Shape{N, k}),
        slot(DType::i32, Shape{N, k}),
        counts(DType::i32, Shape{E}),
        load(stats_dtype(dtype), Shape{E}) {
    args = RouterArgs{.logits = logits,
                      .probs = probs,
                      .expert_idx = expert_idx,
                      .gates = gates,
                      .slot = slot,
                      .counts = counts,
                      .load = load,
                      .top_k = k,
                      .capacity = capacity};
  }
};

std::vector<int32_t> ints(const OwnedTensor& t) {
  return std::vector<int32_t>(t.as<int32_t>(), t.as<int32_t>() + t.numel());
}

}  // namespace

TEST_CASE("router: top-2 with capacity 2 on a hand-worked example") {
  // token 0 prefers 0 then 1; token 1: 0 then 2; token 2: 2 then 1; token 3: 0, then a tie
  // between 1 and 2 that goes to the lower index.
  const Values logits = {2, 1, 0, 2, 0, 1, 0, 1, 2, 3, 0, 0};
  for (DType d : kFloatTypes) {
    INFO(dtype_name(d));
    Router r(d, 4, 3, 2, 2, logits);
    const auto losses = cpu().moe_router_forward(r.args);
    CHECK(ints(r.expert_idx) == std::vector<int32_t>{0, 1, 0, 2, 2, 1, 0, 1});
    // First choices in token order: e0 <- t0 (slot 0), t1 (slot 1); e2 <- t2 (slot 4); t3 finds
    // e0 full and is dropped. Second choices: e1 <- t0 (2), e2 <- t1 (5), e1 <- t2 (3); t3's e1 is
    // full: dropped.
    CHECK(ints(r.slot) == std::vector<int32_t>{0, 2, 1, 5, 4, 3, -1, -1});
    CHECK(ints(r.counts) == std::vector<int32_t>{2, 2, 2});
    CHECK(read(r.load) == Values{3.0 / 8, 3.0 / 8, 2.0 / 8});  // chosen before dropping

    Values probs(12);
    double aux = 0, z = 0;
    for (int n = 0; n < 4; ++n) {
      double total = 0;
      for (int e = 0; e < 3; ++e)
        total += std::exp(logits[static_cast<size_t>(n * 3 + e)]);
      for (int e = 0; e < 3; ++e)
        probs[static_cast<size_t>(n * 3 + e)] =
            std::exp(logits[static_cast<size_t>(n * 3 + e)]) / total;
      z += std::log(total) * std::log(total) / 4;
    }
    const Values load = {3.0 / 8, 3.0 / 8, 2.0 / 8};
    for (int e = 0; e < 3; ++e) {
      double mean = 0;
      for (int n = 0; n < 4; ++n)
        mean += probs[static_cast<size_t>(n * 3 + e)] / 4;
      aux += 3 * load[static_cast<size_t>(e)] * mean;
    }
    const double tol = tolerance(stats_dtype(d));
    CHECK(rel_error(read(r.probs), probs) < tol);
    CHECK(std::abs(losses.aux_loss - aux) < tol * aux);
    CHECK(std::abs(losses.z_loss - z) < tol * z);
    const Values gates = read(r.gates);
    CHECK(std::abs(gates[0] - probs[0]) < tol);
    CHECK(std::abs(gates[7] - probs[10]) < tol);
  }
}

TEST_CASE("router: capacity 0 means unlimited (capacity = N)") {
  Router r(DType::f32, 4, 3, 2, 0, {2, 1, 0, 2, 0, 1, 0, 1, 2, 3, 0, 0});
  cpu().moe_router_forward(r.args);
  CHECK(ints(r.slot) == std::vector<int32_t>{0, 4, 1, 9, 8, 5, 2, 6});
  CHECK(ints(r.counts) == std::vector<int32_t>{3, 3, 2});
}

TEST_CASE("router rejects top_k larger than the expert count") {
  Router r(DType::f32, 2, 2, 2, 0, {0, 0, 0, 0});
  r.args.top_k = 3;
  CHECK_THROWS_WITH(cpu().moe_router_forward(r.args), Catch::Contains("top_k=3"));
}

TEST_CASE("finite differences: router dlogits with aux and z losses and a grad scale") {
  const int64_t N = 6, E = 4, K = 2;
  const double aux_coef = 0.7, z_coef = 0.2, grad_scale = 1.5;
  Router r(DType::f64, N, E, K, 2, random_values(N * E, 200, 1.5));
  OwnedTensor Rg = make(DType::f64, Shape{N, K}, random_values(N * K, 201));
  const auto loss = [&] {
    const auto l = cpu().moe_router_forward(r.args);
    return grad_scale * (dot(read(r.gates), read(Rg)) + aux_coef * l.aux_loss + z_coef * l.z_loss);
  };
  loss();
  CHECK(std::count(r.slot.as<int32_t>(), r.slot.as<int32_t>() + N * K, -1) > 0);  // some dropped
  OwnedTensor dlogits(DType::f64, Shape{N, E});
  cpu().moe_router_backward(dlogits, Rg, r.args, aux_coef, z_coef, grad_scale);
  CHECK(fd_error(r.logits, read(dlogits), loss) < 1e-6);
}

TEST_CASE("router softmax_topk_renorm: the chosen probabilities divided by their sum") {
  const Values logits = {2, 1, 0, 2, 0, 1, 0, 1, 2, 3, 0, 0};
  for (DType d : kFloatTypes) {
    INFO(dtype_name(d));
    Router plain(d, 4, 3, 2, 0, logits), renorm(d, 4, 3, 2, 0, logits);
    renorm.args.renormalize = true;
    const auto a = cpu().moe_router_forward(plain.args);
    const auto b = cpu().moe_router_forward(renorm.args);
    // The choices, slots, loads and losses are the softmax router's; only the gates differ.
    CHECK(ints(renorm.expert_idx) == ints(plain.expert_idx));
    CHECK(ints(renorm.slot) == ints(plain.slot));
    CHECK(read(renorm.load) == read(plain.load));
    CHECK(a.aux_loss == b.aux_loss);
    CHECK(a.z_loss == b.z_loss);
    const Values p = read(plain.gates), g = read(renorm.gates);
    for (size_t n = 0; n < 4; ++n) {
      CHECK(std::abs(g[2 * n] + g[2 * n + 1] - 1) < tolerance(stats_dtype(d)));
      CHECK(std::abs(g[2 * n] - p[2 * n] / (p[2 * n] + p[2 * n + 1])) < tolerance(stats_dtype(d)));
    }
  }
}

TEST_CASE("finite differences: renormalised router dlogits with aux and z losses") {
  const int64_t N = 6, E = 5, K = 3;
  const double aux_coef = 0.7, z_coef = 0.2, grad_scale = 1.5;
  Router r(DType::f64, N, E, K, 0, random_values(N * E, 220, 1.5));
  r.args.renormalize = true;
  OwnedTensor Rg = make(DType::f64, Shape{N, K}, random_values(N * K, 221));
  const auto loss = [&] {
    const auto l = cpu().moe_router_forward(r.args);
    return grad_scale * (dot(read(r.gates), read(Rg)) + aux_coef * l.aux_loss + z_coef * l.z_loss);
  };
  loss();
  OwnedTensor dlogits(DType::f64, Shape{N, E});
  cpu().moe_router_backward(dlogits, Rg, r.args, aux_coef, z_coef, grad_scale);
  CHECK(fd_error(r.logits, read(dlogits), loss) < 1e-6);
  // Gates that sum to one: a gradient equal on a token's choices changes nothing but the
  // aux and z terms, so it must give the dlogits of no gate gradient at all.
  OwnedTensor same = make(DType::f64, Shape{N, K}, Values(static_cast<size_t>(N * K), 0.37));
  OwnedTensor none = make(DType::f64, Shape{N, K}, Values(static_cast<size_t>(N * K), 0.0));
  OwnedTensor d_same(DType::f64, Shape{N, E}), d_none(DType::f64, Shape{N, E});
  cpu().moe_router_backward(d_same, same, r.args, aux_coef, z_coef, grad_scale);
  cpu().moe_router_backward(d_none, none, r.args, aux_coef, z_coef, grad_scale);
  CHECK(rel_error(read(d_same), read(d_none)) < 1e-12);
}

TEST_CASE("router backward in narrow dtypes matches f64") {
  const int64_t N = 5, E = 6, K = 2;
  for (DType d : {DType::f32, DType::bf16, DType::f16}) {
    INFO(dtype_name(d));
    const Values logits = rounded(d, random_values(N * E, 210));
    const Values dg = random_values(N * K, 211);
    Router narrow(d, N, E, K, 3, logits), wide(DType::f64, N, E, K, 3, logits);
    cpu().moe_router_forward(narrow.args);
    cpu().moe_router_forward(wide.args);
    REQUIRE(ints(narrow.slot) == ints(wide.slot));
    OwnedTensor dl(d, Shape{N, E}), dl64(DType::f64, Shape{N, E});
    cpu().moe_router_backward(dl, make(stats_dtype(d), Shape{N, K}, dg), narrow.args, 0.1, 0.01, 2);
    cpu().moe_router_backward(dl64, make(DType::f64, Shape{N, K}, dg), wide.args, 0.1, 0.01, 2);
    CHECK(rel_error(read(dl), read(dl64)) < tolerance(d));
  }
}

TEST_CASE("permute and unpermute move rows by slot, zero unused rows, skip dropped") {
  const int64_t N = 4, C = 5, K = 2, R = 8;
  const std::vector<int32_t> slots = {0, 2, 1, 5, 4, 3, -1, 7};
  OwnedTensor slot = make_i32(Shape{N, K}, slots);
  for (DType d : kFloatTypes) {
    INFO(dtype_name(d));
    const DType A = stats_dtype(d);
    const Values x = rounded(d, random_values(N * C, 220));
    OwnedTensor xt = make(d, Shape{N, C}, x);
    OwnedTensor expert_in = make(d, Shape{R, C}, random_values(R * C, 221));  // stale values
    cpu().moe_permute(expert_in, xt, slot);
    Values ref(static_cast<size_t>(R * C), 0);
    for (int64_t i = 0; i < N * K; ++i)
      if (slots[static_cast<size_t>(i)] >= 0)
        for (int64_t c = 0; c < C; ++c)
          ref[static_cast<size_t>(slots[static_cast<size_t>(i)] * C + c)] =
              x[static_cast<size_t>(i / K * C + c)];
    CHECK(read(expert_in) == ref);  // row 6 is unused: zeroed

    const Values eo = rounded(d, random_values(R * C, 222));
    const Values g = rounded(A, random_values(N * K, 223));
    OwnedTensor eot = make(d, Shape{R, C}, eo), gt = make(A, Shape{N, K}, g), out(d, Shape{N, C});
    cpu().moe_unpermute(out, eot, gt, slot);
    Values ref_out(static_cast<size_t>(N * C), 0), ref_dx(static_cast<size_t>(N * C), 0);
    for (int64_t i = 0; i < N * K; ++i) {
      const int32_t s = slots[static_cast<size_t>(i)];
      if (s < 0) continue;
      for (int64_t c = 0; c < C; ++c) {
        ref_out[static_cast<size_t>(i / K * C + c)] +=
            g[static_cast<size_t>(i)] * eo[static_cast<size_t>(s * C + c)];
        ref_dx[static_cast<size_t>(i / K * C + c)] += eo[static_cast<size_t>(s * C + c)];
      }
    }
    CHECK(rel_error(read(out), ref_out) < tolerance(d));
    OwnedTensor dx(d, Shape{N, C});
    cpu().moe_permute_backward(dx, eot, slot);
    CHECK(rel_error(read(dx), ref_dx) < tolerance(d));
  }
  OwnedTensor bad = make_i32(Shape{N, K}, {0, 8, 1, 2, 3, 4, 5, 6});
  OwnedTensor x(DType::f32, Shape{N, C}), e(DType::f32, Shape{R, C});
  CHECK_THROWS_WITH(cpu().moe_permute(e, x, bad), Catch::Contains("slot[1] = 8"));
}

TEST_CASE("finite differences: permute dx, unpermute dexpert_out and dgates") {
  const int64_t N = 4, C = 3, K = 2, R = 8;
  OwnedTensor slot = make_i32(Shape{N, K}, {0, 2, 1, 5, 4, 3, -1, 7});
  const DType F = DType::f64;
  OwnedTensor x = make(F, Shape{N, C}, random_values(N * C, 230));
  OwnedTensor R1 = make(F, Shape{R, C}, random_values(R * C, 231)), expert_in(F, Shape{R, C});
  const auto permute_loss = [&] {
    cpu().moe_permute(expert_in, x, slot);
    return dot(read(expert_in), read(R1));
  };
  OwnedTensor dx(F, Shape{N, C});
  cpu().moe_permute_backward(dx, R1, slot);
  CHECK(fd_error(x, read(dx), permute_loss) < 1e-6);

  OwnedTensor eo = make(F, Shape{R, C}, random_values(R * C, 232));
  OwnedTensor gates = make(F, Shape{N, K}, random_values(N * K, 233));
  OwnedTensor R2 = make(F, Shape{N, C}, random_values(N * C, 234)), out(F, Shape{N, C});
  const auto unpermute_loss = [&] {
    cpu().moe_unpermute(out, eo, gates, slot);
    return dot(read(out), read(R2));
  };
  OwnedTensor deo = make(F, Shape{R, C}, random_values(R * C, 235));  // stale: overwritten
  OwnedTensor dgates = make(F, Shape{N, K}, random_values(N * K, 236));
  cpu().moe_unpermute_backward(deo, dgates, R2, eo, gates, slot);
  CHECK(fd_error(eo, read(deo), unpermute_loss) < 1e-6);
  CHECK(fd_error(gates, read(dgates), unpermute_loss) < 1e-6);
  CHECK(read(dgates)[6] == 0);  // the dropped assignment
  for (int64_t c = 0; c < C; ++c)
    CHECK(get_element(deo, 6 * C + c) == 0);  // unused row
}
