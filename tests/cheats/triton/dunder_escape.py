# expect: static:dunder | dunder attributes lead from any object back to the interpreter (and os)
# Cheat: reach the builtins through a function's globals to import os without an import line.
import triton


def kforge_launch(inputs, outputs):
    b = kforge_launch.__globals__["__builtins__"]
    os = b["__import__"]("os")
    os.system("true")
    return 0
