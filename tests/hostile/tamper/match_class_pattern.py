"""A match class pattern reads attributes by the keyword's name: no ast.Attribute, no getattr."""
# expect: case ...(__globals__=...)
def grab(fn):
    match fn:
        case object(__globals__=namespace):
            return namespace
