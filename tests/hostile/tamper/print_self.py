"""A builtin function's __self__ is the builtins module: its exec, no bare name needed."""
# expect: ...__self__
def run(code):
    print.__self__.exec(code)
