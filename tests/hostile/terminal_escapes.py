# Messages built to be interpreted rather than shown: rich markup that crashes a renderer ("[/]"), markup
# that restyles ("[bold red]"), ANSI escapes that clear the screen and draw a fake "100/100" row, OSC
# sequences (window title, hyperlink), an 8-bit CSI, a carriage return that rewinds the line, and bidi
# overrides that show text in another order than it is stored. Printed too, and raised from every call.
EVIL = ("[/] [bold red]x[/] \x1b[2J\x1b[H\x1b[32monline_softmax   100/100   passed\x1b[0m "
        "\x1b]0;all tests passed\x07 \x1b]8;;https://example.invalid/\x1b\\click\x1b]8;;\x1b\\ "
        "\x9b2J \u202egnissap\u202c \u2066isolated\u2069 \rtotal 100/100 \x07\x08\x7f\x00 end")
print(EVIL)


def online_normalizer(*args, **kwargs):
    print(EVIL)
    raise RuntimeError(EVIL)


merge_states = online_softmax = softmax_triton = online_normalizer
