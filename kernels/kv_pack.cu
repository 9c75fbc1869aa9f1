// Gather / scatter of KV blocks between a layer-major paged pool and a
// contiguous staging buffer (the wire order of a replication chunk).
//
// Pool layout (as vLLM): [num_layers][2][num_pages][segment], where one
// segment is block_size * num_kv_heads * head_dim elements of one page, so a
// block is num_segments = 2 * num_layers separate segments. Staging layout:
// [num_listed][num_segments][segment], blocks in list order.
//
// The kernels move bytes, so fp16, bf16 and fp32 pools are all handled by the
// same code; segment_bytes is the byte size of one segment. When every
// segment and both base pointers are 16-byte aligned (use_vec16 != 0) each
// thread moves uint4 words, otherwise single bytes (odd geometries only: every
// real model's segment is a multiple of 16 bytes).
//
// One CUDA block per (listed block, segment) pair, grid-stride over pairs;
// threads stride over the segment's words, so accesses are coalesced. The
// host picks blockDim to fit the segment (a 64-byte segment needs 32 threads,
// not 256) and gridDim = min(pairs, cap); the grid-stride loop covers the rest.
//
// Pages are int64 indices, checked on the host (0 <= page < num_pages). In
// unpack two listed entries must not name the same page: parallel writers
// would race, so the host refuses repeats.
//
// No #include: NVRTC (what cupy.RawModule compiles with) ships no C++
// standard headers, and uint4 / long long are built in.

__device__ __forceinline__ void copy_segment(const unsigned char* __restrict__ src,
                                             unsigned char* __restrict__ dst,
                                             long long segment_bytes, int use_vec16) {
  if (use_vec16) {
    const uint4* __restrict__ s = reinterpret_cast<const uint4*>(src);
    uint4* __restrict__ d = reinterpret_cast<uint4*>(dst);
    const long long words = segment_bytes >> 4;
    // Unrolled so each thread has several 16-byte loads in flight.
#pragma unroll 4
    for (long long w = threadIdx.x; w < words; w += blockDim.x) d[w] = s[w];
  } else {
    for (long long b = threadIdx.x; b < segment_bytes; b += blockDim.x) dst[b] = src[b];
  }
}

// Offset of the pair's segment in the pool: [segment][page][segment_bytes].
__device__ __forceinline__ long long pool_offset(const long long* __restrict__ pages, long long pair,
                                                 long long num_segments, long long num_pages,
                                                 long long segment_bytes) {
  const long long listed = pair / num_segments;
  const long long segment = pair - listed * num_segments;
  return (segment * num_pages + pages[listed]) * segment_bytes;
}

extern "C" __global__ void pack_blocks(const unsigned char* __restrict__ pool,
                                       const long long* __restrict__ pages,
                                       unsigned char* __restrict__ staging,
                                       long long num_listed, long long num_segments,
                                       long long num_pages, long long segment_bytes,
                                       int use_vec16) {
  const long long pairs = num_listed * num_segments;
  for (long long pair = blockIdx.x; pair < pairs; pair += gridDim.x) {
    copy_segment(pool + pool_offset(pages, pair, num_segments, num_pages, segment_bytes),
                 staging + pair * segment_bytes, segment_bytes, use_vec16);
  }
}

extern "C" __global__ void unpack_blocks(const unsigned char* __restrict__ staging,
                                         const long long* __restrict__ pages,
                                         unsigned char* __restrict__ pool,
                                         long long num_listed, long long num_segments,
                                         long long num_pages, long long segment_bytes,
                                         int use_vec16) {
  const long long pairs = num_listed * num_segments;
  for (long long pair = blockIdx.x; pair < pairs; pair += gridDim.x) {
    copy_segment(staging + pair * segment_bytes,
                 pool + pool_offset(pages, pair, num_segments, num_pages, segment_bytes), segment_bytes, use_vec16);
  }
}
