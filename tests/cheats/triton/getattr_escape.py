# expect: static:forbidden-name | getattr reaches attributes by a string, past every attribute check
# Cheat: reach Triton's runtime (its driver, cache and knobs) through getattr on an allowed module.
import triton


def kforge_launch(inputs, outputs):
    rt = getattr(triton, "run" + "time")
    rt.driver.active.synchronize()
    return 0
