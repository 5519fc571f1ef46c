// lib/comm: how the ranks of a job find each other and talk.
//   Store        rendezvous key-value store (FileStore, TcpStore), namespaced per job attempt
//   Communicator collectives of one group (Gloo on CPU, NCCL on GPU), with timeouts and CommError
//   Layout/Mesh  the tp, ep, dp, pp and dp*ep groups of a rank, and one communicator for each
//   BackgroundReducer  all_reduce started now, waited for later (overlap with backward)
// See docs/comm.md.
#pragma once

#include "comm/background_reducer.hpp"
#include "comm/communicator.hpp"
#include "comm/error.hpp"
#include "comm/gloo_communicator.hpp"
#include "comm/layout.hpp"
#include "comm/mesh.hpp"
#include "comm/roll_call.hpp"
#include "comm/store.hpp"
