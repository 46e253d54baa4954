# expect: static:module-attribute | triton.knobs / triton.runtime are not the kernel language
# Cheat: turn Triton's cache off / point it elsewhere at run time to share compiled state.
import triton


def kforge_launch(inputs, outputs):
    triton.knobs.cache.dir = "/tmp/shared_cache"
    return 0
