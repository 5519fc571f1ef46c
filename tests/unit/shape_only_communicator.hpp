// A communicator of `size` ranks that knows only its shape: what building a rank's model, planning
// its memory or capturing its checkpoint needs from tp/ep groups. Every collective throws, so a
// test using it proves the code under test does not communicate.
#pragma once

#include <chrono>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>

#include "comm/communicator.hpp"

namespace test_util {

class ShapeOnlyCommunicator final : public trainctl::comm::Communicator {
 public:
  using DType = trainctl::tensor::DType;
  using ms = std::chrono::milliseconds;
  ShapeOnlyCommunicator(std::string name, int rank, int size)
      : name_(std::move(name)), rank_(rank), size_(size) {}
  const std::string& name() const override { return name_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  ms timeout() const override { return std::chrono::seconds(1); }
  void all_reduce_sum(void*, size_t, DType, ms) override { fail(); }
  void all_reduce_max(void*, size_t, DType, ms) override { fail(); }
  void reduce_scatter_sum(const void*, void*, size_t, DType, ms) override { fail(); }
  void reduce_scatter_sum_v(const void*, void*, std::span<const size_t>, DType, ms) override {
    fail();
  }
  void all_gather(const void*, void*, size_t, ms) override { fail(); }
  void all_gather_v(const void*, void*, std::span<const size_t>, ms) override { fail(); }
  void all_to_all(const void*, void*, size_t, ms) override { fail(); }
  void all_to_allv(const void*, std::span<const size_t>, void*, std::span<const size_t>,
                   ms) override {
    fail();
  }
  void send(const void*, size_t, int, uint32_t, ms) override { fail(); }
  void recv(void*, size_t, int, uint32_t, ms) override { fail(); }
  void broadcast(void*, size_t, int, ms) override { fail(); }
  void barrier(ms) override { fail(); }

 private:
  [[noreturn]] void fail() const {
    throw std::logic_error("group " + name_ + " is shape-only: the code under test communicated");
  }
  std::string name_;
  int rank_, size_;
};

}  // namespace test_util
