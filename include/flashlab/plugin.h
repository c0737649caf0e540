/* FlashLab's plugin interface: how `flashlab verify --plugin libmine.so` calls an attention kernel that is not
 * FlashLab's, to check it the way FlashLab checks its own (docs/VERIFY.md).
 *
 * A plugin is a shared library that exports one function,
 *
 *     const flashlab_attention_plugin* flashlab_plugin(void);
 *
 * (or another name, given with --symbol), returning a description that lives as long as the library. It is
 * plain C, so a kernel written in C, C++, CUDA or anything with a C ABI can be a plugin.
 *
 * Tensors. q (B, S_q, H_q, D), k and v (B, S_k, H_kv, D), o and d_o (B, S_q, H_q, D), dq/dk/dv shaped like
 * q/k/v, each addressed through strides in elements (b, s, h, d order); lse (B, H_q, S_q) is contiguous, fp32,
 * natural log, -inf for a row that sees no key. Elements are float for FLASHLAB_DTYPE_F32, and the 16-bit
 * patterns (uint16_t) of IEEE half or bfloat16 for F16 and BF16. The plugin says whether it takes host memory
 * or CUDA device memory; with device memory the calls get a cudaStream_t in `stream`.
 *
 * Masks. Causal top-left: query i sees keys j <= i. Causal bottom-right: query i sees keys
 * j <= i + S_k - S_q (the last query sees every key; when S_q > S_k the first S_q - S_k queries see none, and
 * their O is 0 and their LSE -inf). H_q is a multiple of H_kv: query head h reads K/V head h / (H_q / H_kv).
 *
 * Every call returns 0 on success. Otherwise it returns nonzero and may write one sentence, NUL-terminated,
 * into `message` (capacity `message_size`): why it refused (`supports`) or what went wrong.
 */
#ifndef FLASHLAB_PLUGIN_H
#define FLASHLAB_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FLASHLAB_PLUGIN_ABI_VERSION 1

typedef enum { FLASHLAB_DTYPE_F32 = 1, FLASHLAB_DTYPE_F16 = 2, FLASHLAB_DTYPE_BF16 = 3 } flashlab_dtype;
typedef enum {
  FLASHLAB_CAUSAL_NONE = 0,
  FLASHLAB_CAUSAL_TOP_LEFT = 1,
  FLASHLAB_CAUSAL_BOTTOM_RIGHT = 2
} flashlab_causal;
typedef enum { FLASHLAB_MEMORY_HOST = 0, FLASHLAB_MEMORY_CUDA = 1 } flashlab_memory;

/* One problem: its extents, mask, softmax scale and element type. */
typedef struct {
  int batch, heads_q, heads_kv, seq_q, seq_k, head_dim;
  flashlab_causal causal;
  double scale; /* the softmax scale (verify uses 1 / sqrt(head_dim)) */
  flashlab_dtype dtype;
} flashlab_problem;

/* Strides, in elements, of a (B, S, H, D) tensor. */
typedef struct {
  int64_t b, s, h, d;
} flashlab_strides;

typedef struct {
  const void *q, *k, *v;
  void* o;
  float* lse; /* NULL when the plugin says it writes no LSE */
  flashlab_strides q_strides, k_strides, v_strides, o_strides;
  void* stream; /* cudaStream_t for FLASHLAB_MEMORY_CUDA, else NULL */
} flashlab_forward_args;

typedef struct {
  const void *q, *k, *v, *o, *d_o;
  const float* lse; /* o and lse are FlashLab's reference, so the backward is judged on its own */
  void *dq, *dk, *dv;
  flashlab_strides q_strides, k_strides, v_strides, o_strides; /* dq like q, dk like k, dv like v, d_o like o */
  void* stream;
} flashlab_backward_args;

typedef struct {
  uint32_t abi_version; /* FLASHLAB_PLUGIN_ABI_VERSION */
  const char* name;     /* what the report calls the kernel */
  flashlab_memory memory;
  int writes_lse; /* nonzero: forward writes lse, and verify checks it */
  /* Optional (NULL: every problem): 0 if the kernel runs this problem, else nonzero and why. Verify asks
   * before each case and reports the refusals apart from the failures. */
  int (*supports)(const flashlab_problem* problem, char* message, size_t message_size);
  int (*forward)(const flashlab_problem* problem, const flashlab_forward_args* args, char* message,
                 size_t message_size);
  /* Optional (NULL: no backward): dq, dk, dv from q, k, v, o, lse and d_o. */
  int (*backward)(const flashlab_problem* problem, const flashlab_backward_args* args, char* message,
                  size_t message_size);
} flashlab_attention_plugin;

typedef const flashlab_attention_plugin* (*flashlab_plugin_entry)(void);

#ifdef __cplusplus
}
#endif

#endif /* FLASHLAB_PLUGIN_H */
