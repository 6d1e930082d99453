// The FSDP unit lifecycle's transitions (engine.hpp, UnitState): the legal ones pass, every other one throws an
// InternalError naming the unit and both states.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "shardtrain/fsdp/engine.hpp"
#include "shardtrain/runtime/error.hpp"

using namespace shardtrain;
using namespace shardtrain::fsdp;

namespace {
constexpr UnitState kStates[] = {UnitState::Sharded, UnitState::Gathered, UnitState::InForward, UnitState::InBackward};

bool legal(UnitState from, UnitState to) {
  using S = UnitState;
  const std::vector<std::pair<S, S>> table = {
      {S::Sharded, S::Gathered}, {S::Gathered, S::InForward}, {S::Gathered, S::InBackward}, {S::InForward, S::InBackward},
      {S::Gathered, S::Sharded}, {S::InForward, S::Sharded},  {S::InBackward, S::Sharded},
  };
  for (const auto& [f, t] : table)
    if (f == from && t == to) return true;
  return false;
}
}  // namespace

TEST(UnitState, LegalTransitionsPass) {
  int n = 0;
  for (UnitState from : kStates) {
    for (UnitState to : kStates) {
      if (!legal(from, to)) continue;
      EXPECT_NO_THROW(check_unit_transition(2, "layers.1", from, to))
          << unit_state_name(from) << " -> " << unit_state_name(to);
      ++n;
    }
  }
  EXPECT_EQ(n, 7);
}

TEST(UnitState, IllegalTransitionsThrowNamingUnitAndStates) {
  int n = 0;
  for (UnitState from : kStates) {
    for (UnitState to : kStates) {
      if (legal(from, to)) continue;
      ++n;
      try {
        check_unit_transition(2, "layers.1", from, to);
        ADD_FAILURE() << "no error for " << unit_state_name(from) << " -> " << unit_state_name(to);
      } catch (const InternalError& e) {
        EXPECT_EQ(std::string(e.what()), std::string("FSDP unit 2 (layers.1): illegal state change from ") +
                                             unit_state_name(from) + " to " + unit_state_name(to));
        EXPECT_EQ(e.code(), ExitCode::Internal);
      }
    }
  }
  EXPECT_EQ(n, 9);  // 16 pairs, 7 legal
}

TEST(UnitState, ErrorTextOfAForwardWithoutAGather) {
  // A unit whose forward would begin while it holds only its shard: the engine gathers first (unshard).
  try {
    check_unit_transition(0, "model", UnitState::Sharded, UnitState::InForward);
    FAIL() << "no error";
  } catch (const InternalError& e) {
    EXPECT_STREQ(e.what(), "FSDP unit 0 (model): illegal state change from sharded to in forward");
  }
}
