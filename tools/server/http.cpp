// The HTTP/1.1 layer of `lamina serve` (http.h): Boost.Beast parses, one Asio thread reads heads
// and bodies with deadlines, a worker pool runs handlers and writes their answers with a timeout.
#include "http.h"

#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <optional>
#include <thread>

namespace lamina::cli::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;

namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// %XX decoding (and '+' as a space in a query).
std::string Decode(std::string_view s, bool plus_is_space) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && HexValue(s[i + 1]) >= 0 && HexValue(s[i + 2]) >= 0) {
      out += static_cast<char>(HexValue(s[i + 1]) * 16 + HexValue(s[i + 2]));
      i += 2;
    } else if (plus_is_space && s[i] == '+') {
      out += ' ';
    } else {
      out += s[i];
    }
  }
  return out;
}

std::string Reason(int status) {
  const auto r = bhttp::obsolete_reason(static_cast<bhttp::status>(status));
  return r.empty() ? std::string("Unknown") : std::string(r.data(), r.size());
}

bool BodylessMethod(const std::string& m) {
  return m == "GET" || m == "HEAD" || m == "OPTIONS" || m == "DELETE";
}

// A route's path: "*" (any), a literal, or a literal with one "{int}" (an optional '-' and 1 to
// 10 digits, captured). No regular expressions: matching is linear and never recurses.
struct Route {
  std::string method;
  std::string pattern;
  Handler handler;

  bool Match(const std::string& path, std::vector<std::string>* groups) const {
    groups->clear();
    if (pattern == "*" || pattern == path) {
      groups->push_back(path);
      return true;
    }
    const size_t at = pattern.find("{int}");
    if (at == std::string::npos) return false;
    const std::string_view prefix(pattern.data(), at);
    const std::string_view suffix(pattern.data() + at + 5, pattern.size() - at - 5);
    if (path.size() < prefix.size() + suffix.size() + 1 || path.compare(0, at, prefix) != 0 ||
        path.compare(path.size() - suffix.size(), suffix.size(), suffix) != 0) {
      return false;
    }
    const std::string middle = path.substr(at, path.size() - at - suffix.size());
    const size_t digits_from = !middle.empty() && middle[0] == '-' ? 1 : 0;
    const size_t n_digits = middle.size() - digits_from;
    if (n_digits < 1 || n_digits > 10) return false;
    for (size_t i = digits_from; i < middle.size(); ++i) {
      if (middle[i] < '0' || middle[i] > '9') return false;
    }
    groups->push_back(path);
    groups->push_back(middle);
    return true;
  }
};

// A fixed set of handler threads over one queue.
class WorkerPool {
 public:
  explicit WorkerPool(size_t n) {
    for (size_t i = 0; i < std::max<size_t>(1, n); ++i) threads_.emplace_back([this] { Loop(); });
  }
  ~WorkerPool() { Stop(); }
  void Post(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  size_t queued() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return jobs_.size();
  }

 private:
  void Loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, and the queue drained
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  bool stopping_ = false;
};

// Writes all of data to fd (non-blocking or not), waiting at most timeout_ms for the client to
// take more bytes each time; false when it went away or stalled.
bool SendAll(int fd, const char* data, size_t size, int timeout_ms) {
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n > 0) {
      data += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      const int r = ::poll(&p, 1, timeout_ms);
      if (r <= 0 || (p.revents & (POLLERR | POLLHUP))) return false;
      continue;
    }
    return false;
  }
  return true;
}

double MsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// True when the peer has closed or reset the connection (a half-close counts: an HTTP client
// that shut its sending side wants no more of the answer in practice).
bool PeerGone(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace

std::string Request::get_header_value(const std::string& name) const {
  const std::string key = Lower(name);
  for (const auto& [k, v] : headers) {
    if (k == key) return v;
  }
  return "";
}

bool Request::has_header(const std::string& name) const {
  const std::string key = Lower(name);
  for (const auto& [k, v] : headers) {
    if (k == key) return true;
  }
  return false;
}

std::string Request::get_param_value(const std::string& name) const {
  for (const auto& [k, v] : params) {
    if (k == name) return v;
  }
  return "";
}

void Response::set_header(const std::string& name, const std::string& value) {
  erase_header(name);
  headers.emplace_back(name, value);
}

std::string Response::get_header_value(const std::string& name) const {
  const std::string key = Lower(name);
  for (const auto& [k, v] : headers) {
    if (Lower(k) == key) return v;
  }
  return "";
}

void Response::erase_header(const std::string& name) {
  const std::string key = Lower(name);
  std::erase_if(headers, [&](const auto& h) { return Lower(h.first) == key; });
}

void Response::set_content(std::string content, const std::string& content_type) {
  body = std::move(content);
  set_header("Content-Type", content_type);
}

void Response::set_chunked_content_provider(const std::string& content_type, ContentProvider p,
                                            ContentReleaser r) {
  set_header("Content-Type", content_type);
  provider = std::move(p);
  releaser = std::move(r);
}

class Connection;

class Server::Impl {
 public:
  explicit Impl(Limits l) : limits(l), acceptor(io) {}

  Limits limits;
  asio::io_context io;
  tcp::acceptor acceptor;
  std::vector<Route> routes;
  HeadFilter head_filter;
  ErrorWriter error_writer;
  Decorator decorator;
  AccessLog access_log;
  std::vector<std::pair<std::string, std::string>> default_headers;
  std::unique_ptr<WorkerPool> workers;
  std::atomic<bool> running{false};
  std::atomic<bool> stopped{false};
  // Open connections (touched by the I/O thread only).
  std::list<std::shared_ptr<Connection>> connections;
  std::atomic<size_t> n_open{0};
  std::atomic<size_t> n_busy{0};
  std::atomic<size_t> body_bytes{0};  // reserved by the bodies in flight

  void Accept();
  void MakeRoom();
  const Route* FindRoute(const std::string& method, const std::string& path,
                         std::vector<std::string>* matches, bool* other_method) const;
  std::string Head(const Response& res, bool chunked, bool keep_alive) const;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  enum class State { kHead, kBody, kBusy, kClosed };

  Connection(Server::Impl& s, tcp::socket socket)
      : s_(s), socket_(std::move(socket)), timer_(s.io), buffer_(s.limits.max_head_bytes + 65536) {
    boost::system::error_code ec;
    const tcp::endpoint ep = socket_.remote_endpoint(ec);
    if (!ec) remote_ = ep.address().to_string();
  }

  State state() const { return state_; }
  std::chrono::steady_clock::time_point waiting_since() const { return since_; }
  std::list<std::shared_ptr<Connection>>::iterator self_in_list;

  void ReadHead();
  void Close();
  // From another thread (Stop): make a busy connection's writes fail.
  void ShutDownSocket() {
    boost::system::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
  }

 private:
  void Arm(int ms);
  // The most body bytes the request's method may send.
  size_t BodyCap() const {
    return BodylessMethod(request_.method) ? s_.limits.max_bodyless_bytes
                                           : s_.limits.max_body_bytes;
  }
  void OnHead(boost::system::error_code ec);
  void ReadBody();
  void OnBody(boost::system::error_code ec);
  void Dispatch();
  void Handle();  // on a worker
  // An answer of the layer's own, from the I/O thread; the connection closes after it.
  void Refuse(int status, const std::string& message);
  void RefuseWith(Response res);
  bool WriteResponse(Response& res, bool keep_alive, bool head_only);  // on a worker

  Server::Impl& s_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  State state_ = State::kHead;
  std::chrono::steady_clock::time_point since_ = std::chrono::steady_clock::now();
  std::string remote_;
  Request request_;
  const Route* route_ = nullptr;
  bool keep_alive_ = true;
  std::chrono::steady_clock::time_point head_at_ = std::chrono::steady_clock::now();
  std::string out_;                  // the I/O thread's own answer while it is written
  std::atomic<size_t> reserved_{0};  // this request's share of Impl::body_bytes
  void Release() { s_.body_bytes -= reserved_.exchange(0); }
};

void Connection::Arm(int ms) {
  timer_.expires_after(std::chrono::milliseconds(ms));
  timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (ec) return;  // re-armed or cancelled
    if (self->state_ == State::kHead || self->state_ == State::kBody) self->Close();
  });
}

void Connection::Close() {
  if (state_ == State::kClosed) return;
  if (state_ == State::kBusy) s_.n_busy--;
  state_ = State::kClosed;
  Release();
  boost::system::error_code ec;
  timer_.cancel();
  socket_.shutdown(tcp::socket::shutdown_both, ec);
  socket_.close(ec);
  s_.connections.erase(self_in_list);
  s_.n_open--;
}

void Connection::ReadHead() {
  if (state_ == State::kClosed) return;
  if (state_ == State::kBusy) s_.n_busy--;
  state_ = State::kHead;
  since_ = std::chrono::steady_clock::now();
  parser_.emplace();
  parser_->header_limit(static_cast<std::uint32_t>(s_.limits.max_head_bytes));
  parser_->body_limit(s_.limits.max_body_bytes);
  Arm(s_.limits.head_timeout_ms);
  bhttp::async_read_header(
      socket_, buffer_, *parser_,
      [self = shared_from_this()](boost::system::error_code ec, size_t) { self->OnHead(ec); });
}

void Connection::OnHead(boost::system::error_code ec) {
  if (state_ == State::kClosed) return;
  if (ec == bhttp::error::header_limit || ec == bhttp::error::buffer_overflow) {
    return Refuse(431, "the request head exceeds " + std::to_string(s_.limits.max_head_bytes) +
                           " bytes (request line and headers)");
  }
  if (ec == bhttp::error::body_limit) {
    return Refuse(
        413, "the request body exceeds " + std::to_string(s_.limits.max_body_bytes) + " bytes");
  }
  if (ec == bhttp::error::end_of_stream || ec == asio::error::eof ||
      ec == asio::error::operation_aborted || ec == asio::error::connection_reset) {
    return Close();
  }
  if (ec) return Refuse(400, "malformed HTTP request (" + ec.message() + ")");

  const auto& h = parser_->get();
  head_at_ = std::chrono::steady_clock::now();
  request_ = Request{};
  request_.method = std::string(h.method_string());
  request_.target = std::string(h.target());
  request_.remote_addr = remote_;
  size_t n_fields = 0;
  for (const auto& f : h) {
    if (++n_fields > s_.limits.max_header_count) {
      return Refuse(431, "the request has over " + std::to_string(s_.limits.max_header_count) +
                             " header fields");
    }
    request_.headers.emplace_back(Lower(std::string(f.name_string())), std::string(f.value()));
  }
  const std::string_view target = request_.target;
  const size_t q = target.find('?');
  request_.path = Decode(target.substr(0, q), false);
  if (q != std::string_view::npos) {
    std::string_view query = target.substr(q + 1);
    while (!query.empty()) {
      const size_t amp = query.find('&');
      const std::string_view part = query.substr(0, amp);
      const size_t eq = part.find('=');
      request_.params.emplace_back(
          Decode(part.substr(0, eq), true),
          eq == std::string_view::npos ? "" : Decode(part.substr(eq + 1), true));
      if (amp == std::string_view::npos) break;
      query.remove_prefix(amp + 1);
    }
  }
  keep_alive_ = h.keep_alive();
  // Bodies are taken as sent: a compressed body would bypass the size limit once decoded.
  const std::string encoding = Lower(request_.get_header_value("Content-Encoding"));
  if (!encoding.empty() && encoding != "identity") {
    return Refuse(415, "Content-Encoding \"" + encoding.substr(0, 32) +
                           "\" is not supported: send the body uncompressed");
  }
  const size_t body_cap = BodyCap();
  if (parser_->content_length() && *parser_->content_length() > body_cap) {
    return Refuse(413, "the request body exceeds " + std::to_string(body_cap) + " bytes");
  }
  parser_->body_limit(body_cap);
  const size_t want = parser_->content_length() ? static_cast<size_t>(*parser_->content_length())
                                                : (parser_->chunked() ? body_cap : 0);
  if (want > 0) {
    if (s_.body_bytes.fetch_add(want) + want > s_.limits.max_body_bytes_in_flight) {
      s_.body_bytes -= want;
      return Refuse(503, "the server is receiving too many request bodies; try again");
    }
    reserved_ = want;
  }

  bool other_method = false;
  const std::string method = request_.method == "HEAD" ? "GET" : request_.method;
  route_ = s_.FindRoute(method, request_.path, &request_.matches, &other_method);
  if (s_.head_filter) {
    Response res;
    for (const auto& [k, v] : s_.default_headers) res.set_header(k, v);
    if (s_.head_filter(request_, res)) return RefuseWith(std::move(res));
  }
  if (route_ == nullptr) return Refuse(404, "File Not Found");
  if (request_.get_header_value("Expect").size() > 0 &&
      Lower(request_.get_header_value("Expect")) == "100-continue" && !parser_->is_done()) {
    out_ = "HTTP/1.1 100 Continue\r\n\r\n";
    state_ = State::kBody;
    asio::async_write(socket_, asio::buffer(out_),
                      [self = shared_from_this()](boost::system::error_code ec, size_t) {
                        if (ec) return self->Close();
                        self->ReadBody();
                      });
    return;
  }
  ReadBody();
}

void Connection::ReadBody() {
  if (state_ == State::kClosed) return;
  if (parser_->is_done()) return Dispatch();
  state_ = State::kBody;
  Arm(s_.limits.body_timeout_ms);
  bhttp::async_read(
      socket_, buffer_, *parser_,
      [self = shared_from_this()](boost::system::error_code ec, size_t) { self->OnBody(ec); });
}

void Connection::OnBody(boost::system::error_code ec) {
  if (state_ == State::kClosed) return;
  if (ec == bhttp::error::body_limit || ec == bhttp::error::buffer_overflow) {
    const size_t cap = BodyCap();
    return Refuse(413, "the request body exceeds " + std::to_string(cap) + " bytes");
  }
  if (ec) return Close();
  Dispatch();
}

void Connection::Dispatch() {
  timer_.cancel();
  state_ = State::kBusy;
  s_.n_busy++;
  request_.body = parser_->release().body();
  parser_.reset();
  s_.workers->Post([self = shared_from_this()] { self->Handle(); });
}

void Connection::Handle() {
  Response res;
  for (const auto& [k, v] : s_.default_headers) res.set_header(k, v);
  try {
    route_->handler(request_, res);
  } catch (const std::exception& e) {
    res = Response{};
    for (const auto& [k, v] : s_.default_headers) res.set_header(k, v);
    if (s_.error_writer) s_.error_writer(res, 500, "internal error");
    res.status = 500;
  }
  if (res.status >= 400 && res.body.empty() && !res.provider && s_.error_writer) {
    s_.error_writer(res, res.status, res.status == 404 ? "File Not Found" : Reason(res.status));
  }
  if (s_.decorator) s_.decorator(request_, res);
  const bool ok = WriteResponse(res, keep_alive_, request_.method == "HEAD");
  if (s_.access_log) s_.access_log(request_, res, MsSince(head_at_));
  request_ = Request{};
  Release();
  asio::post(s_.io, [self = shared_from_this(), ok] {
    if (ok && self->keep_alive_ && !self->s_.stopped) {
      self->ReadHead();
    } else {
      self->Close();
    }
  });
}

std::string Server::Impl::Head(const Response& res, bool chunked, bool keep_alive) const {
  std::string head = "HTTP/1.1 " + std::to_string(res.status) + " " + Reason(res.status) + "\r\n";
  for (const auto& [k, v] : res.headers) {
    head += k;
    head += ": ";
    head += v;
    head += "\r\n";
  }
  if (chunked) {
    head += "Transfer-Encoding: chunked\r\n";
  } else if (res.status != 204) {  // a 204 has no body, so no Content-Length (RFC 9110 8.6)
    head += "Content-Length: " + std::to_string(res.body.size()) + "\r\n";
  }
  head += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  return head;
}

namespace {

class ChunkSink : public DataSink {
 public:
  ChunkSink(int fd, int timeout_ms) : fd_(fd), timeout_ms_(timeout_ms) {}
  bool write(const char* data, size_t size) override {
    if (failed_ || finished_) return false;
    if (size == 0) return true;
    if (PeerGone(fd_)) return Fail();
    char len[32];
    const int n = std::snprintf(len, sizeof len, "%zx\r\n", size);
    if (!SendAll(fd_, len, static_cast<size_t>(n), timeout_ms_) ||
        !SendAll(fd_, data, size, timeout_ms_) || !SendAll(fd_, "\r\n", 2, timeout_ms_)) {
      return Fail();
    }
    offset_ += size;
    return true;
  }
  void done() override {
    if (failed_ || finished_) return;
    finished_ = true;
    if (!SendAll(fd_, "0\r\n\r\n", 5, timeout_ms_)) failed_ = true;
  }
  bool finished() const { return finished_ && !failed_; }
  bool failed() const { return failed_; }
  size_t offset() const { return offset_; }

 private:
  bool Fail() {
    failed_ = true;
    return false;
  }
  int fd_;
  int timeout_ms_;
  bool failed_ = false;
  bool finished_ = false;
  size_t offset_ = 0;
};

}  // namespace

bool Connection::WriteResponse(Response& res, bool keep_alive, bool head_only) {
  const int fd = socket_.native_handle();
  const int timeout = s_.limits.write_timeout_ms;
  if (!res.provider) {
    const std::string head = s_.Head(res, false, keep_alive);
    if (!SendAll(fd, head.data(), head.size(), timeout)) return false;
    if (head_only || res.status == 204) return true;
    return SendAll(fd, res.body.data(), res.body.size(), timeout);
  }
  const std::string head = s_.Head(res, true, keep_alive);
  ChunkSink sink(fd, timeout);
  bool ok = SendAll(fd, head.data(), head.size(), timeout);
  if (!ok) {
    if (res.releaser) res.releaser(false);
    return false;
  }
  while (!sink.finished() && !sink.failed()) {
    if (s_.stopped && PeerGone(fd)) break;
    if (!res.provider(sink.offset(), sink)) break;
  }
  ok = sink.finished();
  if (res.releaser) res.releaser(ok);
  return ok;
}

void Connection::Refuse(int status, const std::string& message) {
  Response res;
  for (const auto& [k, v] : s_.default_headers) res.set_header(k, v);
  res.status = status;
  if (s_.error_writer) {
    s_.error_writer(res, status, message);
  } else {
    res.set_content(message, "text/plain");
  }
  RefuseWith(std::move(res));
}

void Connection::RefuseWith(Response res) {
  timer_.cancel();
  if (s_.decorator) s_.decorator(request_, res);
  state_ = State::kBody;  // owned by the I/O thread until closed
  Arm(s_.limits.write_timeout_ms);
  out_ = s_.Head(res, false, false) + (request_.method == "HEAD" ? "" : res.body);
  if (s_.access_log) s_.access_log(request_, res, MsSince(head_at_));
  asio::async_write(
      socket_, asio::buffer(out_),
      [self = shared_from_this()](boost::system::error_code, size_t) { self->Close(); });
}

const Route* Server::Impl::FindRoute(const std::string& method, const std::string& path,
                                     std::vector<std::string>* matches, bool* other_method) const {
  std::vector<std::string> groups;
  for (const Route& r : routes) {
    if (!r.Match(path, &groups)) continue;
    if (r.method != method) {
      *other_method = true;
      continue;
    }
    *matches = std::move(groups);
    return &r;
  }
  return nullptr;
}

void Server::Impl::MakeRoom() {
  if (connections.size() < limits.max_connections) return;
  // The connection that has waited longest for a head gives way to the new client.
  std::shared_ptr<Connection> oldest;
  for (const auto& c : connections) {
    if (c->state() != Connection::State::kHead) continue;
    if (!oldest || c->waiting_since() < oldest->waiting_since()) oldest = c;
  }
  if (oldest) oldest->Close();
}

void Server::Impl::Accept() {
  acceptor.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
    if (stopped) return;
    if (!ec) {
      MakeRoom();
      if (connections.size() >= limits.max_connections) {
        // Every connection has a request in the workers: refuse this one plainly.
        static const char kBusy[] =
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            "Content-Length: 89\r\nConnection: close\r\n\r\n"
            R"({"error":{"code":503,"message":"too many connections","type":"unavailable_error"}})";
        boost::system::error_code ignored;
        socket.non_blocking(true, ignored);
        (void)::send(socket.native_handle(), kBusy, sizeof kBusy - 1, MSG_NOSIGNAL);
        socket.close(ignored);
      } else {
        boost::system::error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);
        auto c = std::make_shared<Connection>(*this, std::move(socket));
        connections.push_front(c);
        c->self_in_list = connections.begin();
        n_open++;
        c->ReadHead();
      }
    } else if (ec == asio::error::no_descriptors) {
      // Out of file descriptors: wait a little rather than spin.
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!stopped) Accept();
  });
}

Server::Server(Limits limits) : impl_(std::make_unique<Impl>(limits)) {}

Server::~Server() { Stop(); }

void Server::Get(const std::string& pattern, Handler h) {
  impl_->routes.push_back({"GET", pattern, std::move(h)});
}
void Server::Post(const std::string& pattern, Handler h) {
  impl_->routes.push_back({"POST", pattern, std::move(h)});
}
void Server::Options(const std::string& pattern, Handler h) {
  impl_->routes.push_back({"OPTIONS", pattern, std::move(h)});
}
void Server::SetHeadFilter(HeadFilter f) { impl_->head_filter = std::move(f); }
void Server::SetErrorWriter(ErrorWriter w) { impl_->error_writer = std::move(w); }
void Server::SetDecorator(Decorator d) { impl_->decorator = std::move(d); }
void Server::SetAccessLog(AccessLog log) { impl_->access_log = std::move(log); }
void Server::SetDefaultHeaders(std::vector<std::pair<std::string, std::string>> headers) {
  impl_->default_headers = std::move(headers);
}

bool Server::Bind(const std::string& host, int port, std::string* error) {
  boost::system::error_code ec;
  const asio::ip::address address =
      asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec) {
    *error = "not an IP address: " + host;
    return false;
  }
  const tcp::endpoint ep(address, static_cast<unsigned short>(port));
  impl_->acceptor.open(ep.protocol(), ec);
  if (!ec) impl_->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(ep, ec);
  if (!ec) impl_->acceptor.listen(1024, ec);
  if (ec) {
    *error = ec.message();
    boost::system::error_code ignored;
    impl_->acceptor.close(ignored);
    return false;
  }
  return true;
}

void Server::Run() {
  if (impl_->stopped) return;
  impl_->workers = std::make_unique<WorkerPool>(impl_->limits.n_workers);
  impl_->Accept();
  impl_->running = true;
  impl_->io.run();
  impl_->running = false;
}

void Server::Stop() {
  if (impl_->stopped.exchange(true)) return;
  Impl& s = *impl_;
  // On the I/O thread: no more accepts; idle connections closed, busy ones shut down so that
  // their workers' writes fail and their handlers end.
  asio::post(s.io, [&s] {
    boost::system::error_code ec;
    s.acceptor.close(ec);
    std::vector<std::shared_ptr<Connection>> all(s.connections.begin(), s.connections.end());
    for (const auto& c : all) {
      if (c->state() == Connection::State::kBusy) {
        c->ShutDownSocket();
      } else {
        c->Close();
      }
    }
  });
  // Wait for the workers while the I/O thread still runs (their last posts land there).
  if (s.running) {
    for (int i = 0; i < 200 && s.n_busy > 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  if (s.workers) s.workers->Stop();
  s.io.stop();
}

bool Server::running() const { return impl_->running; }

Server::Stats Server::stats() const {
  Stats st;
  st.open_connections = impl_->n_open;
  st.busy_connections = impl_->n_busy;
  st.queued_requests = impl_->workers ? impl_->workers->queued() : 0;
  return st;
}

}  // namespace lamina::cli::http
