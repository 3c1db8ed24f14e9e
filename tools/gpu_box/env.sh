# Source from the repository root on the GPU box (`. tools/gpu_box/env.sh`): installs the
# carried .whl/ into $ZOO_SITE (default /tmp/site) once, then puts it first on PYTHONPATH with
# this checkout, offline, so that `python3 -m lm_eval_sinkmask...`, the benchmarks and the
# tests run there on the versions CI tests with.
site=${ZOO_SITE:-/tmp/site}
export PYTHONPATH=$site:$PWD HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
       PYTHONUNBUFFERED=1
if [ ! -f "$site/.installed" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" .whl/*.whl || return 1
    # the hook that registers this project's models and tasks when lm_eval is imported
    cp lm_eval_sinkmask.pth "$(python3 -c 'import site; print(site.getsitepackages()[0])')/" \
        || return 1
    python3 -c "import torch, transformers, lm_eval, lm_eval_sinkmask; \
print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())" \
        || return 1
    touch "$site/.installed"
fi
