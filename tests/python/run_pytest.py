#!/usr/bin/env python3
"""Runs one pytest file of the Python module for CTest, with the interpreter the module was built for.

    run_pytest.py --label cpu|gpu FILE

A `gpu` suite exits 77 (CTest reports it as skipped, never passed) when there is no CUDA device to run
on, saying why. On a machine with one, the suite needs PyTorch with CUDA, and fails when it is missing.
"""
import argparse
import os
import sys

SKIPPED = 77


def gpu_missing():
    """Why the GPU suite cannot run here, or None."""
    import flashlab
    if not flashlab.built_with_cuda:
        return "this build of FlashLab has no CUDA"
    if flashlab.cuda_device_count() == 0:
        return "no CUDA device on this machine"
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", choices=("cpu", "gpu"), required=True)
    parser.add_argument("file")
    args = parser.parse_args()
    if args.label == "gpu":
        reason = gpu_missing()
        if reason:
            print(f"GPU tests skipped: {reason}")
            return SKIPPED
    # Our suites use no third-party plugins; the ones a machine has installed may not fit the pytest found
    # first (the GPU machine's pytest-timeout beside the pytest copy scripts/make_deps.sh carries).
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    try:
        import pytest
    except ImportError:
        print(f"pytest is not installed for {sys.executable} (Debian: python3-pytest, scripts/setup.sh; "
              "on the GPU machine scripts/make_deps.sh carries a copy in .deps/python)")
        return 1
    # No cache folder in the source tree.
    return pytest.main(["-q", "-rs", "-p", "no:cacheprovider", os.path.abspath(args.file)])


if __name__ == "__main__":
    sys.exit(main())
