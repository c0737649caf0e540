# Every CPU test's CTest timeout: three times the time it took in a fresh-clone CI run on a 2-core machine
# (scripts/test.sh, then scripts/test.sh --sanitize, 2026-11-27; ctest runs two tests at a time; the verify tests,
# python_cpu_tests and the three that ran past their old figures, from the run of 98803b3; where the fresh-clone run
# of fe404f7 on 2026-11-28 took longer, up to twice as long on the same kind of machine, its time), rounded up to
# whole seconds, and never under 10 s, since starting any process on a busy machine can take seconds. A timeout
# guards against a hang; it is no speed target. The tests labelled `gpu` run on a GPU machine and keep none. A
# CPU test missing from this table gets a warning at configure time, and no timeout: measure it and add it.
#                                              release  sanitize  (seconds, rounded up; - : not in that build)
set(FLASHLAB_MEASURED_SECONDS
  core_tests                                   1        1
  cpu_reference_tests                          1        2
  backward_plan_tests                          1        -    # 0.02 s here (2026-11-29); built only with the CUDA toolkit
  fp8_tests                                    1        5
  exp2_poly_tests                              1        1    # 0.2 s here, 0.3 s sanitized (2026-11-27)
  lazy_rescale_tests                           1        1
  fp8_toolkit_crosscheck                       45       -    # every float through both conversions: 15 s here; built only with the CUDA toolkit
  ring_tests                                   1        1
  ring_measured_tests                          1        1
  traffic_tests                                1        1
  traffic_gpu_level_tests                      29       9    # sanitized: 4.2 s beside another test, with the one-walk case of 0021877; 8.4 s (fe404f7)
  gpu_counters_tests                           42       55   # 36.3 s and 29.5 s (sanitized) in the fresh-clone run of dadf898; 41.3 s and 54.7 s in fe404f7's
  timeline_tests                               1        1
  ring_timeline_tests                          1        1
  cli_tests                                    15       18   # 2-4 s idle; up to 15.0 s (release) and 17.3 s (sanitized) in CI runs of 8caeb4a and fe404f7
  rendezvous_tests                             3        3
  sdpa_child_tests                             3        3    # 0.6 s here (2026-11-28): a few /bin/sh children and one python3
  python_sdpa_timer_tests                      2        2    # 1.2 s here (2026-11-28)
  python_cpu_tests                             33       -
  cuda_fa2_no_register_spills                  1        -
  check_no_spills_catches_wgmma_serialization  1        1    # a 3-line fixture through check_no_spills.sh: 0.02 s here (2026-11-29)
  cuda_fa2_sass_has_hmma                       29       -    # skipped in CI (no cuobjdump); 29 s on the H200 machine
  cuda_fa3_ws_no_register_spills               1        -
  cuda_fa3_ws_timeline_no_register_spills      1        -
  cuda_fa3_ws_backward_no_register_spills      1        -
  cuda_fa3_ws_backward_other_d64_rows_no_register_spills 1 -  # 0.1 s in the fresh-clone run of fe404f7
  cuda_fa3_ws_e4m3_no_register_spills          1        -
  cuda_fp8_quantize_no_register_spills         1        -
  cuda_fa3_ws_sass_has_hgmma_and_tma           28       -    # the same: 28 s there, dumping the whole binary's SASS
  verify_example_plugin                        34       70   # sanitized: 39 s alone here, 70 s beside another test in fe404f7's run, with --bench's SDPA runs against fake interpreters
  verify_planted_mask                          25       9    # the full suite once, the quick one at three seeds; the sanitizer build: one quick seed
  verify_planted_alignment                     25       10
  verify_planted_tail                          24       10
  verify_planted_rescale                       23       10
  verify_planted_lse_base2                     22       9
  verify_planted_group_sum                     26       6
  verify_planted_scale                         24       6
  verify_cuda_memory_stub                      1        1    # one refusal (no CUDA), or one quick suite of a stub that fails at once
  layers_point_down                            1        1
  layers_check_catches_upward_include          1        1
  docs_generated_blocks                        1        1
  docs_generated_blocks_catch_edits            2        2
  viz_logic_tests                              1        -
  pipeline_view_tests                          1        -
  ring_view_tests                              1        -
  viz_app_tests                                46       -
  viz_render                                   34       -
  viz_drive                                    8        -
  lesson05_fa2_loop_order_cpu                  3        6    # its kernels run on the CPU emulation: 5.8 s sanitized (fe404f7)
)
set(FLASHLAB_TIMEOUT_FLOOR 10)  # the lessons' CPU suites, most well under a second each, get it too

# Sets the timeouts of the tests this directory added (CMake sets test properties per directory): call it at the
# end of each CMakeLists.txt that adds tests.
function(flashlab_apply_timeouts)
  set(column 1)
  if(FLASHLAB_SANITIZE)
    set(column 2)
  endif()
  get_property(tests DIRECTORY PROPERTY TESTS)
  foreach(name IN LISTS tests)
    get_test_property(${name} LABELS labels)
    if("gpu" IN_LIST labels)
      continue()
    endif()
    list(FIND FLASHLAB_MEASURED_SECONDS ${name} at)
    if(at GREATER_EQUAL 0)
      math(EXPR at "${at} + ${column}")
      list(GET FLASHLAB_MEASURED_SECONDS ${at} seconds)
      math(EXPR timeout "3 * ${seconds}")
    elseif(name MATCHES "^lesson")
      set(timeout 0)
    else()
      message(WARNING "test ${name} has no measured time in tests/timeouts.cmake, so it has no timeout")
      continue()
    endif()
    if(timeout LESS FLASHLAB_TIMEOUT_FLOOR)
      set(timeout ${FLASHLAB_TIMEOUT_FLOOR})
    endif()
    set_tests_properties(${name} PROPERTIES TIMEOUT ${timeout})
  endforeach()
endfunction()
