/* A plugin that only says its tensors live in CUDA device memory (FLASHLAB_MEMORY_CUDA), in plain C, so that a build
 * without nvcc has one: `flashlab verify` built without CUDA must refuse it in one sentence, and one built with CUDA
 * must say there is no device or call it with a stream (tests/verify_plugins_test.sh cuda-memory-stub). Its forward
 * computes nothing: it fails, saying whether it got a stream.
 */
#include <flashlab/plugin.h>
#include <stdio.h>

static int forward(const flashlab_problem* problem, const flashlab_forward_args* args, char* message,
                   size_t message_size) {
  (void)problem;
  snprintf(message, message_size, "stub forward called with %s", args->stream != NULL ? "a stream" : "no stream");
  return 1;
}

static const flashlab_attention_plugin kPlugin = {
    .abi_version = FLASHLAB_PLUGIN_ABI_VERSION,
    .name = "cuda-memory-stub",
    .memory = FLASHLAB_MEMORY_CUDA,
    .writes_lse = 1,
    .supports = NULL,
    .forward = forward,
    .backward = NULL,
};

const flashlab_attention_plugin* flashlab_plugin(void);

const flashlab_attention_plugin* flashlab_plugin(void) { return &kPlugin; }
