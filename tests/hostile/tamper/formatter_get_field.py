"""string.Formatter().get_field resolves "0.attr" to the object itself, with a name built at run time."""
# expect: string.Formatter
import string


def grab(fn, name):
    return string.Formatter().get_field("0." + name, (fn,), {})[0]
