// lib/dist: how the ranks of a job find each other and talk.
//   Store        rendezvous key-value store (FileStore, TcpStore), namespaced per job attempt
//   Communicator collectives of one group (Gloo on CPU; NCCL later), with timeouts and DistError
//   Layout/Mesh  the tp, ep, dp, pp and dp*ep groups of a rank, and one communicator for each
//   BackgroundReducer  all_reduce started now, waited for later (overlap with backward)
// See docs/dist.md.
#pragma once

#include "dist/background_reducer.hpp"
#include "dist/communicator.hpp"
#include "dist/error.hpp"
#include "dist/gloo_communicator.hpp"
#include "dist/layout.hpp"
#include "dist/mesh.hpp"
#include "dist/store.hpp"
