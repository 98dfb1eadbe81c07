"""globals() holds __builtins__, whose exec runs any code: the key is built at run time."""
# expect: globals()
def run(code, key):
    globals()[key].__dict__["ex" + "ec"](code)
