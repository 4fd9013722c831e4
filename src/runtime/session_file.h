// Session files: the state of one sequence of a Session (its tokens, its KV cells in their
// encoded form for every KV mode, and an optional payload of the caller), so that a later run
// whose prompt starts with those tokens restores them and evaluates only the rest.
//
// Format (little-endian), version 3 (version 2: the same with the ring field 0; a cache
// without sliding-window rings still writes version 2, and both are read):
//   header, 88 bytes: magic "LAMSESS\0" | u32 version | u32 header bytes (88) | u64 model
//     identity hash | u32 KV mode | u32 V rounding | u64 KV seed | u32 n_layer | u32 n_kv_heads |
//     u32 head_dim | u32 n_vocab | u32 n_tokens | u32 n_sections | u64 KV state bytes |
//     u32 KV window (exact recent cells; 0: none) | u32 sliding-window ring cells (KvCache::
//     ring_cells; 0: every cell kept) | u64 XXH64 of the 80 bytes before it
//   n_sections sections, each: u32 tag | u32 0 | u64 payload bytes | u64 XXH64 of the payload |
//     payload. Tags: "TOKN" (n_tokens x i32), "KVST" (KvCache::ExportSequence's bytes),
//     "APPD" (the caller's bytes, optional; chat keeps its turns there). With a KV window the
//     KV state ends with the window's exact copies, and a ring layer's cells are the recent
//     ones it holds (KvCache::ExportSequence).
// The token section is also the sampler's state: its repetition-penalty history. The sampler's
// RNG is seeded by each run (--seed), as in an uninterrupted run of the same command.
//
// Writing is atomic: a temporary file in the same folder, fsync, rename over the old file,
// fsync of the folder; a process killed at any point leaves the old file or the new one.
// Reading checks every field against this session (model, KV mode and options, shape, context,
// vocabulary), every checksum and the cells (KvCache::CheckSequenceState), and names what is
// wrong.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/session.h"
#include "util/status.h"

namespace lamina {

inline constexpr uint32_t kSessionFileVersion = 3;
// The version of files without sliding-window rings (their field is 0).
inline constexpr uint32_t kSessionFileVersionNoRing = 2;

// Identifies a model as the KV cache sees it: its GGUF metadata, tensor table and the first and
// last 4 KiB of each tensor's data, and the RoPE in effect (command-line overrides included).
uint64_t ModelIdentityHash(const Model& model);

// A parsed session file; pointers into the caller's bytes.
struct SessionFileView {
  std::vector<int32_t> tokens;  // [n_tokens]
  const uint8_t* kv = nullptr;  // [kv_bytes] KvCache::ExportSequence's layout
  uint64_t kv_bytes = 0;
  std::string app;  // the APPD payload ("" when absent)
};

// Parses and checks a session file's bytes against `session` and `model_hash`.
Result<SessionFileView> ParseSessionFile(const uint8_t* data, size_t size, const Session& session,
                                         uint64_t model_hash);

// Sequence `seq`'s tokens and cells (plus `app`) as a session file's bytes.
std::vector<uint8_t> SerializeSessionFile(const Session& session, int seq, uint64_t model_hash,
                                          const std::string& app = "");

// Writes SerializeSessionFile's bytes to `path` atomically (see above).
Status SaveSessionFile(const std::string& path, const Session& session, int seq,
                       uint64_t model_hash, const std::string& app = "");

struct SessionRestore {
  bool found = false;  // false: no file at `path` (nothing restored)
  int n_file = 0;      // tokens the file holds
  std::string app;     // its APPD payload
};
// Reads `path` (absent: found = false) and replaces sequence `seq` by its state; an error (and
// the session unchanged) when the file is refused. Errors begin with the path.
Result<SessionRestore> LoadSessionFile(const std::string& path, Session& session, int seq,
                                       uint64_t model_hash);

// Evaluates the tokens of `history` that sequence `seq` does not hold yet (the last sampled
// token of a generation), so that a saved state covers the whole history; `history` must begin
// with the tokens the sequence holds. Stops quietly at a full context.
Status CatchUp(Session& session, int seq, const std::vector<int32_t>& history);

}  // namespace lamina
