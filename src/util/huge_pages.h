// An allocator for large streamed buffers (the KV cache's cells): allocations of 2 MiB or more
// are 2 MiB aligned and advised to the kernel as transparent huge pages (MADV_HUGEPAGE) before
// they are first touched, so a stream over them walks one page table entry per 2 MiB instead of
// 512 (fewer TLB misses, and the hardware prefetcher is not cut at every 4 KiB page on the
// kernels that back them with huge pages). Where transparent huge pages are off, or the advice
// fails, the memory is ordinary pages: the same bytes, only slower to stream.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <type_traits>

namespace lamina {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// Advises the whole huge pages inside [p, p + bytes) as transparent huge pages (a buffer that
// was not allocated huge-page aligned: its interior 2 MiB extents). Call before the buffer is
// first written; returns the bytes advised (0 where none fits or the kernel refuses). Advice
// only: the bytes are the same either way.
inline size_t AdviseHugePages(void* p, size_t bytes) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first = (begin + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  const uintptr_t last = (begin + bytes) / kHugePageBytes * kHugePageBytes;
  if (last <= first) return 0;
  if (::madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE) != 0) return 0;
  return last - first;
}

template <typename T>
struct HugePageAllocator {
  using value_type = T;
  // The advice travels with the buffer.
  using propagate_on_container_copy_assignment = std::true_type;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;

  HugePageAllocator() = default;
  // advise false: the same aligned allocation without the advice (ordinary pages), to measure
  // the difference.
  explicit HugePageAllocator(bool advise) : advise(advise) {}
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>& o) : advise(o.advise) {}  // NOLINT: rebinding

  T* allocate(size_t n) {
    if (n > static_cast<size_t>(-1) / sizeof(T)) throw std::bad_array_new_length();
    const size_t bytes = n * sizeof(T);
    if (bytes < kHugePageBytes) return static_cast<T*>(::operator new(bytes));
    // Whole huge pages, so the advice covers every byte of the buffer.
    const size_t rounded = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    void* p = std::aligned_alloc(kHugePageBytes, rounded);
    if (p == nullptr) throw std::bad_alloc();
    // Advice only: ordinary pages if refused.
    ::madvise(p, rounded, advise ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) {
    if (n * sizeof(T) < kHugePageBytes) {
      ::operator delete(p);
    } else {
      std::free(p);
    }
  }

  template <typename U>
  bool operator==(const HugePageAllocator<U>& o) const {
    return advise == o.advise;
  }

  bool advise = true;
};

}  // namespace lamina
