# Paddock's Python code-interpreter driver: one process per context, run as `python3 -c`.
# Requests are JSON lines on the driver's own stdin ({"code": ...}); user code reads /dev/null.
# Replies are marker lines, MARK + JSON, written to fd 1 after user output is flushed; a done
# marker on fd 2 tells the server that stderr is drained too.
# asyncio and traceback are imported when first needed: they would triple the start-up time.
import ast, builtins, json, linecache, os, signal, sys, types

MARK = ("\x1ePADDOCK-" + os.environ.pop("PADDOCK_CODE_NONCE", "") + " ").encode()
_requests = os.fdopen(os.dup(0), "rb")
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)
sys.stdin = open(os.devnull)
# Line-buffered, not unbuffered: print() writes its text and its newline separately, and a line
# should arrive as one output event (as with Jupyter). Partial lines are flushed before markers.
for _s in (sys.stdout, sys.stderr):
    try:
        _s.reconfigure(line_buffering=True)
    except Exception:
        pass
_user = {"__name__": "__main__", "__builtins__": builtins}
_loop = None
_cells = 0
_FLAGS = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)


def _flush():
    for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            s.flush()
        except Exception:
            pass


def _reply(obj, fd=1):
    data = MARK + json.dumps(obj).encode() + b"\n"
    while data:
        data = data[os.write(fd, data):]


def _await(value):
    # Top-level await compiles to a coroutine; one event loop per context runs them all.
    global _loop
    if isinstance(value, types.CoroutineType):
        if _loop is None:
            import asyncio
            _loop = asyncio.new_event_loop()
        return _loop.run_until_complete(value)
    return value


def _mime(value):
    out = {"text/plain": repr(value)}
    for key, method in (("text/html", "_repr_html_"), ("image/png", "_repr_png_"), ("image/svg+xml", "_repr_svg_")):
        fn = getattr(value, method, None)
        if callable(fn):
            try:
                data = fn()
                if isinstance(data, bytes):
                    import base64
                    data = base64.b64encode(data).decode()
                if isinstance(data, str):
                    out[key] = data
            except Exception:
                pass
    return out


def _figures():
    # Open matplotlib figures become image/png results after each cell, then are closed, as a
    # notebook shows them; without matplotlib imported there is nothing to do.
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return []
    out = []
    try:
        import base64, io
        for num in plt.get_fignums():
            fig = plt.figure(num)
            buf = io.BytesIO()
            fig.savefig(buf, format="png", bbox_inches="tight")
            out.append({"t": "display", "data": {"text/plain": repr(fig), "image/png": base64.b64encode(buf.getvalue()).decode()}})
        plt.close("all")
    except Exception as e:
        sys.stderr.write("paddock: could not render a matplotlib figure: %r\n" % (e,))
    return out


def _error(exc):
    import traceback
    tb = exc.__traceback__
    # Frames of this driver are no business of the user's.
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    if isinstance(exc, SyntaxError):
        lines = traceback.format_exception_only(type(exc), exc)
    else:
        lines = traceback.format_exception(type(exc), exc, tb)
    text = "".join(lines).rstrip("\n")
    return {"t": "error", "ename": type(exc).__name__, "evalue": str(exc), "traceback": text.split("\n")}


def _run(code):
    global _cells
    _cells += 1
    name = "<cell-%d>" % _cells
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    tree = ast.parse(code, name, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    if tree.body:
        _await(eval(compile(tree, name, "exec", flags=_FLAGS), _user))
    if last is not None:
        value = _await(eval(compile(last, name, "eval", flags=_FLAGS), _user))
        if value is not None:
            _user["_"] = value
            return value
    return None


__file__ = sys._getframe().f_code.co_filename
signal.signal(signal.SIGINT, signal.SIG_IGN)
_reply({"t": "ready"})
_reply({"t": "ready"}, 2)
while True:
    line = _requests.readline()
    if not line:
        break
    try:
        code = json.loads(line)["code"]
    except Exception as e:
        _reply({"t": "error", "ename": "ProtocolError", "evalue": str(e), "traceback": []})
        _reply({"t": "done"})
        _reply({"t": "done"}, 2)
        continue
    reply = None
    try:
        # Interrupts become KeyboardInterrupt only while user code runs, as in a kernel.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            value = _run(code)
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        if value is not None:
            reply = {"t": "result", "data": _mime(value)}
    except BaseException as e:  # SystemExit and KeyboardInterrupt too: the context lives on
        reply = _error(e)
    displays = _figures()
    _flush()
    for d in displays:
        _reply(d)
    if reply is not None:
        try:
            _reply(reply)
        except Exception as e:
            _reply({"t": "error", "ename": type(e).__name__, "evalue": "cannot encode the result: %s" % e, "traceback": []})
    _reply({"t": "done"})
    _reply({"t": "done"}, 2)
