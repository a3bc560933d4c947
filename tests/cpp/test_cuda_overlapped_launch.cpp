// GPU tests of overlapping launches (programmatic dependent launch, cuda/launch/pdl_launch.h).
// A chain of decode- and prefill-sized linears in which every call reads what the kernel just
// before it wrote (bf16 in, bf16 out: activation quantization, then the GEMM; or the
// weight-only GEMM), on one stream with nothing in between, so each launch may start while its
// producer still runs. A kernel that read its inputs, or wrote anything, before waiting for the
// earlier kernels would see the poisoned buffers or race with them. The chain is compared bit
// for bit with the same chain run one call at a time (the stream drained before each launch, so
// nothing can overlap), eagerly, and the captured graph of the chain replays to the same result.
// Each test skips, saying why, without a usable GPU.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "nibble/nibble.h"
#include "test_util.h"

namespace nibble {
namespace {

#if NIBBLE_WITH_CUDA
// One linear of the chain: packed weights (W4A8 and W4A16: linear(x, packed), float in), or
// logical ones on the GPU with their int8 activations (W8A8: quantize_activation into qa, then
// linear(qa, logical)).
struct Layer {
  bool is_packed = false;
  PackedWeight packed;
  QuantizedWeight logical;
  QuantizedActivation qa;
};

struct Chain {
  std::vector<Layer> layers;
  std::vector<Tensor> acts;  // acts[0] is the input, acts[i + 1] = linear(acts[i], layer i)

  // Every call, queued back to back; `drain` waits for the stream before each launch.
  void run(cudaStream_t stream, bool drain) {
    for (size_t i = 0; i < layers.size(); ++i) {
      Layer& layer = layers[i];
      if (drain) {
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      }
      if (layer.is_packed) {
        linear(acts[i].view(), layer.packed.view(), nullptr, acts[i + 1].view(), stream);
        continue;
      }
      quantize_activation(acts[i].view(), layer.qa.view(), stream);
      if (drain) {
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      }
      linear(layer.qa.view(), layer.logical.view(), nullptr, acts[i + 1].view(), stream);
    }
  }
  void poison() {
    for (size_t i = 1; i < acts.size(); ++i) acts[i].fill_bytes(0xFF);
    for (Layer& layer : layers) {
      if (layer.is_packed) continue;
      layer.qa.q.fill_bytes(0x7F);
      layer.qa.scales.fill_bytes(0xFF);
    }
  }
};

// Formats whose decode and small-prefill paths run the overlapping kernels, alternated:
// W4A8 (act_quant + sm80_w4a8_gemm's thin tiles at M ≤ 32; on Hopper sm90_w4a8_gemm's cluster
// split grids at M = 64), W4A16 (sm80_weight_only_gemm; sm90_weight_only_gemm's cluster splits
// at M = 256), W8A8 (act_quant + sm80_w8a8_gemm / sm90_w8a8_gemm's cluster splits at M = 64);
// square layers, K = 4096, so the split-K plans (workspace and counters reused by the next call,
// or a tile's splits in one cluster) are in the chain too.
Chain make_chain(int64_t m, test::Rng& rng) {
  const int64_t d = 4096;
  Chain c;
  for (const char* name : {"w4a8_pc", "w4a16_g128", "w8a8", "w4a8_g128", "w4a8_g128_2level",
                           "w4a8_pc", "w8a8", "w4a16_g128_asym"}) {
    const LinearFormat f = parse_linear_format(name);
    // σ = 1/√K keeps the activations' magnitude about 1 through the chain.
    const QuantizedWeight qw = test::random_quantized_weight(f.weight, d, d, rng, 1.0 / 64.0);
    Layer layer;
    layer.is_packed = f.weight.scheme != WeightScheme::s8_sym;  // W8A8 runs the logical one
    if (layer.is_packed) {
      layer.packed = pack_weight(qw.view(), packed_layout(f), Device::cuda());
    } else {
      layer.logical = qw.to(Device::cuda());
      layer.qa = QuantizedActivation(f.act, m, d, Device::cuda());
    }
    c.layers.push_back(std::move(layer));
  }
  c.acts.push_back(test::random_activations(DType::bf16, m, d, rng).to(Device::cuda()));
  for (size_t i = 0; i < c.layers.size(); ++i)
    c.acts.push_back(Tensor::empty(DType::bf16, {m, d}, Device::cuda()));
  return c;
}

TEST(CudaOverlappedLaunch, ChainedDecodeLinearsEqualOneCallAtATime) {
  NIBBLE_REQUIRE_GPU();
  test::Rng rng;
  for (int64_t m : {1, 5, 16, 64, 256}) {
    SCOPED_TRACE("M=" + std::to_string(m));
    Chain c = make_chain(m, rng);
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    c.poison();
    c.run(stream, true);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<Tensor> one_at_a_time;
    for (size_t i = 1; i < c.acts.size(); ++i) one_at_a_time.push_back(c.acts[i].to(Device::cpu()));
    for (int round = 0; round < 3; ++round) {
      c.poison();
      c.run(stream, false);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      for (size_t i = 1; i < c.acts.size(); ++i)
        ASSERT_TRUE(same_bytes(c.acts[i].to(Device::cpu()), one_at_a_time[i - 1]))
            << "layer " << i << ", round " << round;
    }
    ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  }
}

TEST(CudaOverlappedLaunch, ChainedDecodeLinearsReplayInACudaGraph) {
  NIBBLE_REQUIRE_GPU();
  test::Rng rng;
  Chain c = make_chain(1, rng);
  Tensor eager = Tensor::empty(DType::bf16, {1, 4096}, Device::cuda());
  Tensor replay = Tensor::empty(DType::bf16, {1, 4096}, Device::cuda());
  size_t nodes = 0;
  c.poison();
  expect_graph_replay_matches(
      [&](cudaStream_t stream, Tensor& out) {
        c.run(stream, false);
        ASSERT_EQ(cudaMemcpyAsync(out.view().data, c.acts.back().view().data, 4096 * 2,
                                  cudaMemcpyDeviceToDevice, stream),
                  cudaSuccess);
      },
      eager, replay, &nodes);
  EXPECT_GE(nodes, c.layers.size());
}
#endif

}  // namespace
}  // namespace nibble
