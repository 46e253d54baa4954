# Sourced by the bench/gpu_*.sh scripts on the GPU machine (from the repository root): installs
# the wheels carried to an offline GPU machine (tree-sitter, liger-kernel, ...) when .whl/ exists,
# and sets the environment. Once per shell: a script that runs another one does not reinstall.
if [ -z "${KFORGE_GPU_ENV:-}" ]; then
  if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site:$PWD
  else
    export PYTHONPATH=$PWD
  fi
  export KFORGE_CACHE=/tmp/kcache LITELLM_LOCAL_MODEL_COST_MAP=True PYTHONUNBUFFERED=1 KFORGE_GPU_ENV=1
fi
