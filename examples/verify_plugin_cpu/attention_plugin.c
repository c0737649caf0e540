/* A small CPU attention kernel in plain C, as a `flashlab verify` plugin (include/flashlab/plugin.h).
 *
 * Forward: for each query row Q_i, an online softmax over key blocks of kBlock keys, the way FlashAttention
 * does it: a running max m_i, a running sum l_i and an accumulator O_i, rescaled whenever the max moves.
 * Backward: P_ij recomputed from the LSE L_i, then dV, dP, dS, dQ and dK, one (i, j) pair at a time.
 *
 * Built with -DFLASHLAB_PLANTED_BUG=BUG_xxx, the same source becomes a kernel with one planted bug, which
 * verify must catch. Each bug is one marked `#if` below.
 */
#include <flashlab/plugin.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define BUG_NONE 0
#define BUG_MASK 1       /* the causal mask is ignored */
#define BUG_ALIGNMENT 2  /* bottom-right causal is treated as top-left */
#define BUG_TAIL 3       /* the last partial key block is skipped */
#define BUG_RESCALE 4    /* O_i is not rescaled when the running max moves */
#define BUG_LSE_BASE2 5  /* the LSE is written in base 2 */
#define BUG_GROUP_SUM 6  /* GQA: dK, dV of a K/V head hold one query head's share, not the group's sum */
#define BUG_SCALE 7      /* the scale is 1 / head_dim, not problem->scale */

#ifndef FLASHLAB_PLANTED_BUG
#define FLASHLAB_PLANTED_BUG BUG_NONE
#endif

#if FLASHLAB_PLANTED_BUG == BUG_NONE
#define KERNEL_NAME "example-cpu"
#elif FLASHLAB_PLANTED_BUG == BUG_MASK
#define KERNEL_NAME "planted-mask"
#elif FLASHLAB_PLANTED_BUG == BUG_ALIGNMENT
#define KERNEL_NAME "planted-alignment"
#elif FLASHLAB_PLANTED_BUG == BUG_TAIL
#define KERNEL_NAME "planted-tail"
#elif FLASHLAB_PLANTED_BUG == BUG_RESCALE
#define KERNEL_NAME "planted-rescale"
#elif FLASHLAB_PLANTED_BUG == BUG_LSE_BASE2
#define KERNEL_NAME "planted-lse-base2"
#elif FLASHLAB_PLANTED_BUG == BUG_GROUP_SUM
#define KERNEL_NAME "planted-group-sum"
#elif FLASHLAB_PLANTED_BUG == BUG_SCALE
#define KERNEL_NAME "planted-scale"
#else
#error "FLASHLAB_PLANTED_BUG names no known bug"
#endif

enum { kBlock = 64 }; /* keys per block of the online softmax */

/* Writes one sentence into message, if there is room for any. */
static void say(char* message, size_t message_size, const char* format, ...) {
  if (message == NULL || message_size == 0) return;
  va_list ap;
  va_start(ap, format);
  vsnprintf(message, message_size, format, ap);
  va_end(ap);
}

static const char* dtype_name(flashlab_dtype dtype) {
  switch (dtype) {
    case FLASHLAB_DTYPE_F32: return "f32";
    case FLASHLAB_DTYPE_F16: return "f16";
    case FLASHLAB_DTYPE_BF16: return "bf16";
  }
  return "an unknown type";
}

/* 0 if this kernel runs the problem, else nonzero and why. */
static int check_problem(const flashlab_problem* p, char* message, size_t message_size) {
  if (p->dtype != FLASHLAB_DTYPE_F32) {
    say(message, message_size, "this example kernel takes f32 only, not %s", dtype_name(p->dtype));
    return 1;
  }
  if (p->heads_kv <= 0 || p->heads_q % p->heads_kv != 0) {
    say(message, message_size, "H_q (%d) is not a multiple of H_kv (%d)", p->heads_q, p->heads_kv);
    return 1;
  }
  return 0;
}

static int supports(const flashlab_problem* problem, char* message, size_t message_size) {
  return check_problem(problem, message, message_size);
}

/* The softmax scale. */
static float softmax_scale(const flashlab_problem* p) {
#if FLASHLAB_PLANTED_BUG == BUG_SCALE
  return 1.0f / (float)p->head_dim; /* planted: ignores problem->scale, uses 1 / head_dim */
#else
  return (float)p->scale;
#endif
}

/* Query i sees keys 0 .. end-1; this returns end (0: the row sees no key). Every mask here is a prefix. */
static int key_end(const flashlab_problem* p, int i) {
  flashlab_causal causal = p->causal;
  int end = p->seq_k;
#if FLASHLAB_PLANTED_BUG == BUG_MASK
  causal = FLASHLAB_CAUSAL_NONE; /* planted: ignores the causal mask, every key is visible */
#endif
#if FLASHLAB_PLANTED_BUG == BUG_TAIL
  if (p->seq_k >= kBlock) end = p->seq_k / kBlock * kBlock; /* planted: whole blocks only, the tail is dropped */
#endif
  int last = end; /* one past the last key the mask lets through */
  if (causal == FLASHLAB_CAUSAL_TOP_LEFT) {
    last = i + 1;
  } else if (causal == FLASHLAB_CAUSAL_BOTTOM_RIGHT) {
#if FLASHLAB_PLANTED_BUG == BUG_ALIGNMENT
    last = i + 1; /* planted: bottom-right aligned like top-left, the S_k - S_q offset dropped */
#else
    last = i + 1 + p->seq_k - p->seq_q;
#endif
  }
  if (last < end) end = last;
  return end > 0 ? end : 0;
}

/* Row (b, s, h) of a (B, S, H, D) tensor; its element d is row[d * st.d]. */
static const float* row_in(const void* t, flashlab_strides st, int b, int s, int h) {
  return (const float*)t + b * st.b + s * st.s + h * st.h;
}
static float* row_out(void* t, flashlab_strides st, int b, int s, int h) {
  return (float*)t + b * st.b + s * st.s + h * st.h;
}

static float dot(const float* x, int64_t x_step, const float* y, int64_t y_step, int n) {
  float sum = 0.0f;
  for (int d = 0; d < n; ++d) sum += x[d * x_step] * y[d * y_step];
  return sum;
}

static int forward(const flashlab_problem* p, const flashlab_forward_args* a, char* message,
                   size_t message_size) {
  if (check_problem(p, message, message_size) != 0) return 1;
  const int D = p->head_dim, group = p->heads_q / p->heads_kv;
  const float scale = softmax_scale(p);
  float* acc = malloc(sizeof(float) * (size_t)(D + kBlock)); /* O_i, then the block's scores S_ij */
  if (acc == NULL) {
    say(message, message_size, "out of memory");
    return 1;
  }
  float* s = acc + D;

  for (int b = 0; b < p->batch; ++b) {
    for (int h = 0; h < p->heads_q; ++h) {
      const int hk = h / group; /* the K/V head this query head reads */
      for (int i = 0; i < p->seq_q; ++i) {
        const float* q = row_in(a->q, a->q_strides, b, i, h);
        float* o = row_out(a->o, a->o_strides, b, i, h);
        const int end = key_end(p, i);
        float m = -INFINITY, l = 0.0f; /* running max m_i and running sum l_i */
        for (int d = 0; d < D; ++d) acc[d] = 0.0f;

        for (int j0 = 0; j0 < end; j0 += kBlock) {
          const int j1 = j0 + kBlock < end ? j0 + kBlock : end;
          /* S_ij = scale * Q_i . K_j for the block's keys, and the new max. */
          float m_new = m;
          for (int j = j0; j < j1; ++j) {
            const float* k = row_in(a->k, a->k_strides, b, j, hk);
            s[j - j0] = scale * dot(q, a->q_strides.d, k, a->k_strides.d, D);
            if (s[j - j0] > m_new) m_new = s[j - j0];
          }
          /* The max moved: what l_i and O_i hold was weighted by exp(-m_old), now by exp(-m_new). */
          if (m_new > m) {
            const float alpha = expf(m - m_new); /* 0 on the first block, where m = -inf */
            l *= alpha;
#if FLASHLAB_PLANTED_BUG != BUG_RESCALE /* planted: rescales l_i but not O_i */
            for (int d = 0; d < D; ++d) acc[d] *= alpha;
#endif
            m = m_new;
          }
          /* P_ij = exp(S_ij - m_i): add it to l_i, and P_ij V_j to O_i. */
          for (int j = j0; j < j1; ++j) {
            const float* v = row_in(a->v, a->v_strides, b, j, hk);
            const float pij = expf(s[j - j0] - m);
            l += pij;
            for (int d = 0; d < D; ++d) acc[d] += pij * v[d * a->v_strides.d];
          }
        }

        /* O_i = acc / l_i and L_i = m_i + log(l_i); a row that sees no key gets O_i = 0, L_i = -inf. */
        const float inv_l = end > 0 ? 1.0f / l : 0.0f;
        for (int d = 0; d < D; ++d) o[d * a->o_strides.d] = acc[d] * inv_l;
        if (a->lse != NULL) {
          float lse = end > 0 ? m + logf(l) : -INFINITY;
#if FLASHLAB_PLANTED_BUG == BUG_LSE_BASE2
          lse = lse / logf(2.0f); /* planted: writes the LSE in base 2 */
#endif
          a->lse[((int64_t)b * p->heads_q + h) * p->seq_q + i] = lse;
        }
      }
    }
  }
  free(acc);
  return 0;
}

/* Sets rows 0 .. seq-1 of head h of batch b to zero. */
static void zero_head(void* t, flashlab_strides st, int b, int h, int seq, int D) {
  for (int j = 0; j < seq; ++j) {
    float* r = row_out(t, st, b, j, h);
    for (int d = 0; d < D; ++d) r[d * st.d] = 0.0f;
  }
}

static int backward(const flashlab_problem* p, const flashlab_backward_args* a, char* message,
                    size_t message_size) {
  if (check_problem(p, message, message_size) != 0) return 1;
  if (a->lse == NULL) {
    say(message, message_size, "the backward needs the forward's LSE");
    return 1;
  }
  const int D = p->head_dim, group = p->heads_q / p->heads_kv;
  const float scale = softmax_scale(p);
  float* dq = malloc(sizeof(float) * (size_t)(D + 1)); /* dQ_i, summed over j */
  if (dq == NULL) {
    say(message, message_size, "out of memory");
    return 1;
  }
  /* d_o is addressed like o, dq like q, dk like k, dv like v. */
  const flashlab_strides qs = a->q_strides, ks = a->k_strides, vs = a->v_strides, os = a->o_strides;

  for (int b = 0; b < p->batch; ++b) {
    for (int h = 0; h < p->heads_q; ++h) {
      const int hk = h / group;
      /* dK and dV of a K/V head are sums over the query heads of its group: the first one starts them. */
#if FLASHLAB_PLANTED_BUG == BUG_GROUP_SUM
      const int start_sum = 1; /* planted: every query head restarts them, so only the group's last counts */
#else
      const int start_sum = h % group == 0;
#endif
      if (start_sum) {
        zero_head(a->dk, ks, b, hk, p->seq_k, D);
        zero_head(a->dv, vs, b, hk, p->seq_k, D);
      }

      for (int i = 0; i < p->seq_q; ++i) {
        const float* q = row_in(a->q, qs, b, i, h);
        const float* o = row_in(a->o, os, b, i, h);
        const float* d_o = row_in(a->d_o, os, b, i, h);
        const float lse = a->lse[((int64_t)b * p->heads_q + h) * p->seq_q + i];
        const int end = lse == -INFINITY ? 0 : key_end(p, i); /* L_i = -inf: the row saw no key */
        const float Di = dot(d_o, os.d, o, os.d, D);    /* D_i = dO_i . O_i */
        for (int d = 0; d < D; ++d) dq[d] = 0.0f;

        for (int j = 0; j < end; ++j) {
          const float* k = row_in(a->k, ks, b, j, hk);
          const float* v = row_in(a->v, vs, b, j, hk);
          float* dk = row_out(a->dk, ks, b, j, hk);
          float* dv = row_out(a->dv, vs, b, j, hk);
          const float pij = expf(scale * dot(q, qs.d, k, ks.d, D) - lse); /* P_ij */
          const float dpij = dot(d_o, os.d, v, vs.d, D);                   /* dP_ij = dO_i . V_j */
          const float dsij = pij * (dpij - Di);                            /* dS_ij */
          for (int d = 0; d < D; ++d) {
            dv[d * vs.d] += pij * d_o[d * os.d];        /* dV_j += P_ij dO_i */
            dq[d] += scale * dsij * k[d * ks.d];        /* dQ_i += scale dS_ij K_j */
            dk[d * ks.d] += scale * dsij * q[d * qs.d]; /* dK_j += scale dS_ij Q_i */
          }
        }
        float* dq_row = row_out(a->dq, qs, b, i, h);
        for (int d = 0; d < D; ++d) dq_row[d * qs.d] = dq[d];
      }
    }
  }
  free(dq);
  return 0;
}

static const flashlab_attention_plugin kPlugin = {
    .abi_version = FLASHLAB_PLUGIN_ABI_VERSION,
    .name = KERNEL_NAME,
    .memory = FLASHLAB_MEMORY_HOST,
    .writes_lse = 1,
    .supports = supports,
    .forward = forward,
    .backward = backward,
};

const flashlab_attention_plugin* flashlab_plugin(void);

const flashlab_attention_plugin* flashlab_plugin(void) { return &kPlugin; }
