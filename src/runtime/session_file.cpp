// Session files (session_file.h): serialization, checks, atomic writes.
#include "runtime/session_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "util/hash.h"
#include "util/mapped_file.h"
#include "util/memory.h"

namespace lamina {

namespace {

constexpr char kMagic[8] = {'L', 'A', 'M', 'S', 'E', 'S', 'S', '\0'};
constexpr uint32_t kHeaderBytes = 88;
constexpr uint32_t kSectionHeaderBytes = 24;
constexpr uint32_t kTagTokens = 0x4e4b4f54;  // "TOKN"
constexpr uint32_t kTagKv = 0x5453564b;      // "KVST"
constexpr uint32_t kTagApp = 0x44505041;     // "APPD"
constexpr uint32_t kMaxSections = 16;

void HashValue(Xxh64& h, const gguf::Value& v) {
  h.UpdatePod(static_cast<uint32_t>(v.type));
  h.UpdatePod(v.u);
  h.UpdatePod(v.i);
  h.UpdatePod(v.f);
  h.UpdatePod(static_cast<uint64_t>(v.str.size()));
  h.Update(v.str);
  h.UpdatePod(static_cast<uint32_t>(v.elem_type));
  h.UpdatePod(static_cast<uint64_t>(v.array.size()));
  for (const gguf::Value& e : v.array) HashValue(h, e);
}

template <typename T>
void Put(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

template <typename T>
T Get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

std::string TagName(uint32_t tag) {
  std::string s(4, '?');
  for (int i = 0; i < 4; ++i) {
    const char c = static_cast<char>((tag >> (8 * i)) & 0xff);
    s[i] = (c >= 0x20 && c < 0x7f) ? c : '?';
  }
  return s;
}

std::string Hex(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

Status WriteAll(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Error{std::string("write: ") + std::strerror(errno)};
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

// The model hash a session's file records: a context rotating with the model's long RoPE
// (phi3 past its original context) holds keys no other context can read, so it gets its own.
uint64_t SessionModelHash(const Session& session, uint64_t model_hash) {
  return session.long_rope() ? model_hash ^ 0x6c6f6e67726f7065ull : model_hash;  // "longrope"
}

}  // namespace

uint64_t ModelIdentityHash(const Model& model) {
  Xxh64 h(0x6c616d696e61ull);  // "lamina"
  const gguf::File& f = model.file();
  for (const auto& [key, value] : f.metadata()) {
    h.UpdatePod(static_cast<uint64_t>(key.size()));
    h.Update(key);
    HashValue(h, value);
  }
  for (const gguf::TensorInfo& t : f.tensors()) {
    h.UpdatePod(static_cast<uint64_t>(t.name.size()));
    h.Update(t.name);
    h.UpdatePod(static_cast<uint32_t>(t.type));
    for (int64_t ne : t.ne) h.UpdatePod(ne);
    h.UpdatePod(t.n_bytes);
    const uint64_t head = std::min<uint64_t>(t.n_bytes, 4096);
    if (t.data != nullptr) {
      h.Update(t.data, head);
      if (t.n_bytes > head) {
        const uint64_t tail = std::min<uint64_t>(t.n_bytes - head, 4096);
        h.Update(t.data + t.n_bytes - tail, tail);
      }
    }
  }
  const RopeParams& r = model.hparams().rope;
  h.UpdatePod(r.n_rot);
  h.UpdatePod(r.freq_base);
  h.UpdatePod(r.freq_scale);
  h.UpdatePod(r.ext_factor);
  h.UpdatePod(r.attn_factor);
  h.UpdatePod(r.beta_fast);
  h.UpdatePod(r.beta_slow);
  h.UpdatePod(r.n_ctx_orig);
  h.UpdatePod(static_cast<int>(r.style));
  // Sliding-window layers (only where a model has them, so other models' hashes stay as they
  // were): the window, which layers, their RoPE base.
  const Hparams& hp = model.hparams();
  if (!hp.swa_layers.empty()) {
    h.UpdatePod(hp.n_swa);
    h.Update(hp.swa_layers.data(), hp.swa_layers.size());
    h.UpdatePod(hp.rope_swa.freq_base);
  }
  return h.Digest();
}

std::vector<uint8_t> SerializeSessionFile(const Session& session, int seq, uint64_t model_hash,
                                          const std::string& app) {
  const KvCache& cache = session.cache();
  const KvCacheConfig& c = cache.config();
  const std::vector<int32_t>& tokens = session.tokens(seq);
  const int n = static_cast<int>(tokens.size());
  const uint64_t kv_bytes = cache.SequenceStateBytes(n);
  const uint32_t n_sections = app.empty() ? 2 : 3;
  std::vector<uint8_t> out;
  out.reserve(kHeaderBytes + 3 * kSectionHeaderBytes + n * sizeof(int32_t) + kv_bytes + app.size());
  out.insert(out.end(), kMagic, kMagic + 8);
  Put<uint32_t>(out, cache.has_rings() ? kSessionFileVersion : kSessionFileVersionNoRing);
  Put<uint32_t>(out, kHeaderBytes);
  Put<uint64_t>(out, SessionModelHash(session, model_hash));
  Put<uint32_t>(out, static_cast<uint32_t>(c.type));
  Put<uint32_t>(out, static_cast<uint32_t>(c.v_rounding));
  Put<uint64_t>(out, c.seed);
  Put<uint32_t>(out, static_cast<uint32_t>(c.n_layer));
  Put<uint32_t>(out, static_cast<uint32_t>(c.n_kv_heads));
  Put<uint32_t>(out, static_cast<uint32_t>(c.head_dim));
  Put<uint32_t>(out, static_cast<uint32_t>(session.model().hparams().n_vocab));
  Put<uint32_t>(out, static_cast<uint32_t>(n));
  Put<uint32_t>(out, n_sections);
  Put<uint64_t>(out, kv_bytes);
  Put<uint32_t>(out, static_cast<uint32_t>(cache.window()));
  Put<uint32_t>(out, static_cast<uint32_t>(cache.ring_cells()));
  Put<uint64_t>(out, Xxh64::Of(out.data(), out.size()));
  auto section = [&](uint32_t tag, const void* payload, uint64_t size) {
    Put<uint32_t>(out, tag);
    Put<uint32_t>(out, 0);
    Put<uint64_t>(out, size);
    Put<uint64_t>(out, Xxh64::Of(payload, size));
    const auto* p = static_cast<const uint8_t*>(payload);
    out.insert(out.end(), p, p + size);
  };
  section(kTagTokens, tokens.data(), static_cast<uint64_t>(n) * sizeof(int32_t));
  std::vector<uint8_t> kv(kv_bytes);  // [kv_bytes] ExportSequence's layout
  cache.ExportSequence(seq, n, kv.data());
  section(kTagKv, kv.data(), kv.size());
  if (!app.empty()) section(kTagApp, app.data(), app.size());
  return out;
}

namespace {

// The header fields the sections are read against.
struct SessionHeader {
  uint32_t n_vocab = 0;
  uint32_t n_tokens = 0;
  uint32_t n_sections = 0;
  uint64_t kv_bytes = 0;
};

// The header's magic, version, checksum and model identity.
Status CheckHeaderIdentity(const uint8_t* data, size_t size, uint64_t model_hash) {
  if (size < kHeaderBytes || std::memcmp(data, kMagic, 8) != 0) {
    return Error{size < 8 || std::memcmp(data, kMagic, 8) != 0
                     ? "not a lamina session file (no LAMSESS magic)"
                     : "truncated: " + std::to_string(size) + " bytes, the header alone has " +
                           std::to_string(kHeaderBytes)};
  }
  const uint32_t version = Get<uint32_t>(data + 8);
  if (version != kSessionFileVersion && version != kSessionFileVersionNoRing) {
    return Error{"format version " + std::to_string(version) + ", this lamina reads versions " +
                 std::to_string(kSessionFileVersionNoRing) + " and " +
                 std::to_string(kSessionFileVersion)};
  }
  const uint32_t ring = Get<uint32_t>(data + 76);
  if (Get<uint32_t>(data + 12) != kHeaderBytes ||
      (version == kSessionFileVersionNoRing ? ring != 0 : ring == 0) ||
      Get<uint64_t>(data + 80) != Xxh64::Of(data, 80)) {
    return Error{"header checksum mismatch (the file is corrupt)"};
  }
  const uint64_t hash = Get<uint64_t>(data + 16);
  if (hash != model_hash) {
    return Error{"made with another model (model identity " + Hex(hash) + ", this model " +
                 Hex(model_hash) + ")"};
  }
  return Status::Ok();
}

// The header's KV mode, V rounding, seed, window and cache shape against this session's.
Status CheckHeaderCache(const uint8_t* data, const Session& session) {
  const KvCacheConfig& c = session.cache().config();
  const uint32_t kv_type = Get<uint32_t>(data + 24);
  const uint32_t v_round = Get<uint32_t>(data + 28);
  const uint64_t kv_seed = Get<uint64_t>(data + 32);
  if (kv_type >= static_cast<uint32_t>(kKvModeCount) ||
      v_round > static_cast<uint32_t>(KvRounding::kStochastic)) {
    return Error{"unknown KV mode " + std::to_string(kv_type) + " / V rounding " +
                 std::to_string(v_round)};
  }
  if (kv_type != static_cast<uint32_t>(c.type)) {
    return Error{std::string("made with KV mode ") + KvTypeName(static_cast<KvType>(kv_type)) +
                 ", this run uses " + KvTypeName(c.type) + " (--kv)"};
  }
  if (v_round != static_cast<uint32_t>(c.v_rounding) || kv_seed != c.seed) {
    return Error{std::string("made with V rounding ") +
                 KvRoundingName(static_cast<KvRounding>(v_round)) + " and KV seed " +
                 std::to_string(kv_seed) + ", this run uses " + KvRoundingName(c.v_rounding) +
                 " and " + std::to_string(c.seed) + " (--kv-v-round, --kv-seed)"};
  }
  const uint32_t window = Get<uint32_t>(data + 72);
  if (window != static_cast<uint32_t>(session.cache().window())) {
    return Error{"made with a KV window of " + std::to_string(window) +
                 " exact cells, this run uses " + std::to_string(session.cache().window()) +
                 " (--kv-window)"};
  }
  const uint32_t ring = Get<uint32_t>(data + 76);
  if (ring != static_cast<uint32_t>(session.cache().ring_cells())) {
    auto kept = [](uint32_t cells) {
      return cells == 0 ? std::string("every cell")
                        : "a ring of " + std::to_string(cells) + " cells";
    };
    return Error{"made with sliding-window layers keeping " + kept(ring) + ", this run keeps " +
                 kept(session.cache().ring_cells()) + " (--swa-full, -c)"};
  }
  const uint32_t n_layer = Get<uint32_t>(data + 40), n_kv_heads = Get<uint32_t>(data + 44);
  const uint32_t head_dim = Get<uint32_t>(data + 48), n_vocab = Get<uint32_t>(data + 52);
  if (n_layer != static_cast<uint32_t>(c.n_layer) ||
      n_kv_heads != static_cast<uint32_t>(c.n_kv_heads) ||
      head_dim != static_cast<uint32_t>(c.head_dim) ||
      n_vocab != static_cast<uint32_t>(session.model().hparams().n_vocab)) {
    return Error{"cache shape " + std::to_string(n_layer) + " layers x " +
                 std::to_string(n_kv_heads) + " KV heads x " + std::to_string(head_dim) +
                 ", vocabulary " + std::to_string(n_vocab) + " differs from this model's"};
  }
  return Status::Ok();
}

// The checked header: identity, cache, then the token, section and KV byte counts.
Result<SessionHeader> ReadSessionHeader(const uint8_t* data, size_t size, const Session& session,
                                        uint64_t model_hash) {
  if (Status st = CheckHeaderIdentity(data, size, SessionModelHash(session, model_hash));
      !st.ok()) {
    return st.error();
  }
  if (Status st = CheckHeaderCache(data, session); !st.ok()) return st.error();
  SessionHeader header;
  header.n_vocab = Get<uint32_t>(data + 52);
  header.n_tokens = Get<uint32_t>(data + 56);
  header.n_sections = Get<uint32_t>(data + 60);
  header.kv_bytes = Get<uint64_t>(data + 64);
  const uint32_t n_tokens = header.n_tokens;
  if (n_tokens > static_cast<uint32_t>(session.n_ctx())) {
    return Error{"holds " + std::to_string(n_tokens) + " tokens, more than the context of " +
                 std::to_string(session.n_ctx()) + " (-c)"};
  }
  if (header.kv_bytes != session.cache().SequenceStateBytes(static_cast<int>(n_tokens))) {
    return Error{"KV state of " + std::to_string(header.kv_bytes) + " bytes does not fit " +
                 std::to_string(n_tokens) + " tokens in this KV mode"};
  }
  if (header.n_sections < 2 || header.n_sections > kMaxSections) {
    return Error{"section count " + std::to_string(header.n_sections) + " out of range"};
  }
  return header;
}

// The sections read so far.
struct SectionsRead {
  SessionFileView view;
  bool have_tokens = false;
  bool have_kv = false;
};

// One section's checked payload into the view.
Status ReadSectionPayload(uint32_t tag, const uint8_t* payload, uint64_t bytes,
                          const SessionHeader& header, const Session& session, SectionsRead* read) {
  const uint32_t n_tokens = header.n_tokens;
  if (tag == kTagTokens) {
    if (read->have_tokens || bytes != static_cast<uint64_t>(n_tokens) * sizeof(int32_t)) {
      return Error{"token section of " + std::to_string(bytes) + " bytes for " +
                   std::to_string(n_tokens) + " tokens"};
    }
    std::vector<int32_t>& tokens = read->view.tokens;
    tokens.resize(n_tokens);
    std::memcpy(tokens.data(), payload, bytes);
    for (uint32_t i = 0; i < n_tokens; ++i) {
      if (tokens[i] < 0 || static_cast<uint32_t>(tokens[i]) >= header.n_vocab) {
        return Error{"token " + std::to_string(i) + " (id " + std::to_string(tokens[i]) +
                     ") is outside the vocabulary"};
      }
    }
    read->have_tokens = true;
  } else if (tag == kTagKv) {
    if (read->have_kv || bytes != header.kv_bytes) {
      return Error{"KV section of " + std::to_string(bytes) + " bytes, the header says " +
                   std::to_string(header.kv_bytes)};
    }
    if (Status st = session.cache().CheckSequenceState(static_cast<int>(n_tokens), payload);
        !st.ok()) {
      return Error{"KV section: " + st.error().message + " (the file is corrupt)"};
    }
    read->view.kv = payload;
    read->view.kv_bytes = bytes;
    read->have_kv = true;
  } else if (tag == kTagApp) {
    read->view.app.assign(reinterpret_cast<const char*>(payload), bytes);
  } else {
    return Error{"unknown section " + TagName(tag)};
  }
  return Status::Ok();
}

// Section `s`, whose header is at byte *at: its header and checksum checked, its payload read;
// *at moves past it.
Status ReadSection(const uint8_t* data, size_t size, uint32_t s, const SessionHeader& header,
                   const Session& session, size_t* at, SectionsRead* read) {
  if (size - *at < kSectionHeaderBytes) {
    return Error{"truncated: section " + std::to_string(s) + " header at byte " +
                 std::to_string(*at) + " of " + std::to_string(size)};
  }
  const uint32_t tag = Get<uint32_t>(data + *at);
  const uint64_t bytes = Get<uint64_t>(data + *at + 8);
  const uint64_t sum = Get<uint64_t>(data + *at + 16);
  if (Get<uint32_t>(data + *at + 4) != 0) {
    return Error{"section " + std::to_string(s) + " header at byte " + std::to_string(*at) +
                 " is corrupt (reserved field not 0)"};
  }
  *at += kSectionHeaderBytes;
  if (bytes > size - *at) {
    return Error{"truncated: section " + TagName(tag) + " needs " + std::to_string(bytes) +
                 " bytes at byte " + std::to_string(*at) + ", " + std::to_string(size - *at) +
                 " left"};
  }
  const uint8_t* payload = data + *at;
  if (Xxh64::Of(payload, bytes) != sum) {
    return Error{"checksum mismatch in section " + TagName(tag) + " (the file is corrupt)"};
  }
  if (Status st = ReadSectionPayload(tag, payload, bytes, header, session, read); !st.ok()) {
    return st;
  }
  *at += bytes;
  return Status::Ok();
}

}  // namespace

Result<SessionFileView> ParseSessionFile(const uint8_t* data, size_t size, const Session& session,
                                         uint64_t model_hash) {
  Result<SessionHeader> header = ReadSessionHeader(data, size, session, model_hash);
  if (!header.ok()) return header.error();
  SectionsRead read;
  size_t at = kHeaderBytes;
  for (uint32_t s = 0; s < header->n_sections; ++s) {
    if (Status st = ReadSection(data, size, s, *header, session, &at, &read); !st.ok()) {
      return st.error();
    }
  }
  if (!read.have_tokens || !read.have_kv) return Error{"a token or KV section is missing"};
  if (at != size) {
    return Error{std::to_string(size - at) + " bytes after the last section"};
  }
  return std::move(read.view);
}

Status SaveSessionFile(const std::string& path, const Session& session, int seq,
                       uint64_t model_hash, const std::string& app) {
  if (!session.recurrent().empty()) {
    return Error{path + ": session files hold K/V only; this model's recurrent state is not saved"};
  }
  const std::vector<uint8_t> bytes = SerializeSessionFile(session, seq, model_hash, app);
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Error{tmp + ": cannot create: " + std::strerror(errno)};
  Status st = WriteAll(fd, bytes.data(), bytes.size());
  if (st.ok() && ::fsync(fd) != 0) st = Error{std::string("fsync: ") + std::strerror(errno)};
  if (::close(fd) != 0 && st.ok()) st = Error{std::string("close: ") + std::strerror(errno)};
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    st = Error{std::string("rename: ") + std::strerror(errno)};
  }
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return Error{path + ": " + st.error().message};
  }
  // The rename itself reaches the disk with the folder's fsync.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return Status::Ok();
}

Result<SessionRestore> LoadSessionFile(const std::string& path, Session& session, int seq,
                                       uint64_t model_hash) {
  SessionRestore out;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return out;
  if (!session.recurrent().empty()) {
    return Error{path +
                 ": session files hold K/V only; this model's recurrent state cannot be "
                 "restored from one"};
  }
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && st.st_size == 0) {
    return Error{path + ": truncated: the file is empty"};
  }
  Result<std::unique_ptr<MappedFile>> file = MappedFile::Open(path);
  if (!file.ok()) return Error{path + ": " + file.error().message};
  Result<SessionFileView> view =
      ParseSessionFile((*file)->data(), (*file)->size(), session, model_hash);
  if (!view.ok()) return Error{path + ": " + view.error().message};
  session.RestoreSequence(seq, view->tokens, view->kv);
  out.found = true;
  out.n_file = static_cast<int>(view->tokens.size());
  out.app = std::move(view->app);
  return out;
}

Status CatchUp(Session& session, int seq, const std::vector<int32_t>& history) {
  const int held = session.n_past(seq);
  const int n = std::min<int>(static_cast<int>(history.size()), session.n_ctx()) - held;
  if (n <= 0) return Status::Ok();
  Result<const float*> r = session.EvalSeq(seq, history.data() + held, n, /*all_logits=*/false);
  if (!r.ok()) return r.error();
  return Status::Ok();
}

}  // namespace lamina
