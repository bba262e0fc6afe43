"""The unmodified `opensandbox-code-interpreter==1.1.1` SDK against Paddock's `/code` routes:
the default readiness check, contexts per language with state kept between runs, results,
errors, interrupt, default contexts and refusals. Each test runs in both connection modes.

The image must have python3, node and bash (the host's root has them); the SDK's readiness
probe is answered by the local runtime's sandbox init only, so elsewhere the interpreter is
created without it."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from code_interpreter.code_interpreter import CodeInterpreter
from code_interpreter.models.code import SupportedLanguage
from code_interpreter.sync.code_interpreter import CodeInterpreterSync
from conftest import IMAGE, capabilities, run_ok
from opensandbox import Sandbox
from opensandbox.config import ConnectionConfig
from opensandbox.exceptions import SandboxException
from opensandbox.models.execd_sync import ExecutionHandlersSync


def local_runtime(server) -> bool:
    return capabilities(server).get("runtime") == "local"


def need_interpreters(sandbox) -> None:
    ex = sandbox.commands.run("command -v python3 && command -v node && command -v bash")
    if ex.exit_code != 0:
        pytest.skip(f"the image {IMAGE!r} lacks python3, node or bash")


@pytest.fixture
def interpreter(server, sandbox) -> CodeInterpreterSync:
    need_interpreters(sandbox)
    # The SDK's default readiness check (GET /ping, then bash /dev/tcp to 127.0.0.1:44771),
    # answered by the local runtime's sandbox init and by the agent in a Kubernetes Pod.
    ci = CodeInterpreterSync.create(sandbox)
    yield ci
    ci.close()


def test_create_with_the_default_readiness_check_is_quick(server, sandbox):
    need_interpreters(sandbox)
    t0 = time.monotonic()
    ci = CodeInterpreterSync.create(sandbox)
    try:
        assert time.monotonic() - t0 < 10, "the readiness check should pass at once"
        assert ci.is_healthy()
    finally:
        ci.close()


# What each language defines in one run and reads in the next, and the value it expects.
STATEFUL = {
    SupportedLanguage.PYTHON: ("x = 40\ndef add(a):\n    return a + 2", "print('hi')\nadd(x)", "hi\n", "42"),
    SupportedLanguage.JAVASCRIPT: ("var x = 40; function add(a) { return a + 2 }", "console.log('hi'); add(x)", "hi\n", "42"),
    SupportedLanguage.BASH: ("x=40; add() { echo $(( $1 + 2 )); }; cd /tmp", "echo hi; add $x; pwd", "hi\n42\n/tmp\n", None),
}


@pytest.mark.parametrize("language", list(STATEFUL))
def test_a_context_keeps_its_state_between_runs(interpreter, language):
    first, second, stdout, result = STATEFUL[language]
    ctx = interpreter.codes.create_context(language)
    assert ctx.id and ctx.language == language
    ex = interpreter.codes.run(first, context=ctx)
    assert ex.error is None, ex.error
    assert ex.id == ctx.id, "init carries the context id, which interrupt takes"
    assert ex.complete is not None
    ex = interpreter.codes.run(second, context=ctx)
    assert ex.error is None, ex.error
    assert "".join(m.text for m in ex.logs.stdout) == stdout
    if result is not None:
        assert [r.text for r in ex.result] == [result]
        assert ex.execution_count == 2
    assert ex.complete is not None

    got = interpreter.codes.get_context(ctx.id)
    assert (got.id, got.language) == (ctx.id, language)
    assert ctx.id in [c.id for c in interpreter.codes.list_contexts(language)]
    interpreter.codes.delete_context(ctx.id)
    assert ctx.id not in [c.id for c in interpreter.codes.list_contexts(language)]
    with pytest.raises(SandboxException):
        interpreter.codes.get_context(ctx.id)


def test_errors_carry_name_value_and_traceback(interpreter):
    ctx = interpreter.codes.create_context(SupportedLanguage.PYTHON)
    ex = interpreter.codes.run("print('before')\nundefined_variable", context=ctx)
    assert ex.error is not None
    assert ex.error.name == "NameError"
    assert "undefined_variable" in ex.error.value
    assert ex.error.traceback[0] == "Traceback (most recent call last):"
    assert any("<cell-1>" in line for line in ex.error.traceback), ex.error.traceback
    assert [m.text for m in ex.logs.stdout] == ["before\n"]

    js = interpreter.codes.create_context(SupportedLanguage.JAVASCRIPT)
    ex = interpreter.codes.run("null.field", context=js)
    assert ex.error is not None and ex.error.name == "TypeError", ex.error

    sh = interpreter.codes.create_context(SupportedLanguage.BASH)
    ex = interpreter.codes.run("echo out; exit_with() { return $1; }; exit_with 3", context=sh)
    assert ex.error is not None and ex.error.name and ex.error.value == "3", ex.error


def test_interrupt_stops_a_busy_loop_and_the_context_lives_on(interpreter):
    ctx = interpreter.codes.create_context(SupportedLanguage.PYTHON)
    interpreter.codes.run("kept = 'yes'", context=ctx)
    started = threading.Event()
    ids: list[str] = []

    def on_init(init):
        ids.append(init.id)
        started.set()

    result: dict = {}

    def run():
        result["ex"] = interpreter.codes.run(
            "import time\nwhile True:\n    time.sleep(0.01)",
            context=ctx,
            handlers=ExecutionHandlersSync(on_init=on_init),
        )

    t = threading.Thread(target=run)
    t.start()
    assert started.wait(30), "no init event"
    time.sleep(0.5)
    # A second run on a busy context is refused, as execd does.
    busy = interpreter.codes.run("1", context=ctx)
    assert busy.error is not None and "busy" in busy.error.value, busy.error
    t0 = time.monotonic()
    interpreter.codes.interrupt(ids[0])
    t.join(15)
    assert not t.is_alive(), "the interrupted run did not end"
    assert time.monotonic() - t0 < 10
    assert result["ex"].error is not None and result["ex"].error.name == "KeyboardInterrupt", result["ex"].error
    ex = interpreter.codes.run("kept", context=ctx)
    assert [r.text for r in ex.result] == ["'yes'"]


def test_runs_without_a_context_use_the_languages_default(interpreter):
    ex = interpreter.codes.run("default_var = 5")
    assert ex.error is None, ex.error
    ex = interpreter.codes.run("default_var * 2")
    assert [r.text for r in ex.result] == ["10"]
    ex = interpreter.codes.run("1 + 1", language=SupportedLanguage.JAVASCRIPT)
    assert [r.text for r in ex.result] == ["2"]
    assert interpreter.codes.list_contexts(SupportedLanguage.PYTHON), "the default context is listed"
    interpreter.codes.delete_contexts(SupportedLanguage.PYTHON)
    assert interpreter.codes.list_contexts(SupportedLanguage.PYTHON) == []
    ex = interpreter.codes.run("'default_var' in dir()")
    assert [r.text for r in ex.result] == ["False"], "deleting by language drops the default context too"


def test_unsupported_languages_are_refused_clearly(interpreter):
    with pytest.raises(SandboxException) as e:
        interpreter.codes.create_context("cobol")
    assert "not supported" in str(e.value)


def go_path() -> str:
    go = shutil.which("go") or "/usr/local/go/bin/go"
    return f"{os.path.dirname(go)}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def test_java_go_and_typescript_run_what_opensandboxs_own_suite_sends(server, make_sandbox):
    """The snippets and checks of OpenSandbox's code-interpreter suite for Java, Go and
    TypeScript (tests/python/tests/test_code_interpreter_e2e_sync.py), on the host's root:
    a JDK, Go (on the PATH given) and Node with the typescript package, as CI installs them."""
    if not local_runtime(server):
        pytest.skip("the cluster's test image has no JDK, Go or TypeScript")
    sb = make_sandbox(env={"PATH": go_path()})
    ci = CodeInterpreterSync.create(sb, skip_health_check=True)
    try:
        java = ci.codes.create_context(SupportedLanguage.JAVA)
        assert java.id and java.language == "java"
        ex = ci.codes.run('System.out.println("Hello from Java!");\nint result = 2 + 2;\n'
                          'System.out.println("2 + 2 = " + result);\nresult', context=java)
        assert ex.error is None, ex.error
        assert [r.text for r in ex.result] == ["4"] and ex.complete is not None
        out = "".join(m.text for m in ex.logs.stdout)
        assert "Hello from Java!" in out and "2+2=4" in out.replace(" ", ""), out
        ex = ci.codes.run("import java.util.*;\nList<Integer> numbers = Arrays.asList(1, 2, 3, 4, 5);\n"
                          "int sum = numbers.stream().mapToInt(Integer::intValue).sum();\n"
                          'System.out.println("Sum: " + sum);\nresult', context=java)
        assert [r.text for r in ex.result] == ["4"], "state is kept between runs"
        ex = ci.codes.run("int x = 10 / 0; // This will cause ArithmeticException", context=java)
        assert ex.error is not None and ex.error.name == "EvalException", ex.error
        assert "ArithmeticException" in ex.error.value, ex.error

        go = ci.codes.create_context(SupportedLanguage.GO)
        assert go.id and go.language == "go"
        ex = ci.codes.run('package main\nimport "fmt"\nfunc main() {\n    fmt.Print("Hello from Go!")\n'
                          '    result := 2 + 2\n    fmt.Print("2 + 2 =", result)\n}', context=go)
        assert ex.error is None, ex.error
        assert "Hello from Go!" in "".join(m.text for m in ex.logs.stdout)
        ex = ci.codes.run("package main\nfunc main() {\n    undeclaredVariable++  // This will cause compilation error\n}",
                          context=go)
        assert ex.error is not None and "undeclaredVariable" in ex.error.value, ex.error
        # The drivers remove their build directories once started, and each Go cell its own.
        left = run_ok(sb, "find /tmp -maxdepth 2 \\( -name driver -o -name 'paddock-go-*' "
                          "-o -name PaddockDriver.java \\) -print")
        assert left == [], left

        ts = ci.codes.create_context(SupportedLanguage.TYPESCRIPT)
        assert ts.id and ts.language == "typescript"
        ex = ci.codes.run("console.log('Hello from TypeScript!');\nconst result: number = 2 + 2;\n"
                          "console.log(`2 + 2 = ${result}`);", context=ts)
        assert ex.error is None, ex.error
        assert "".join(m.text for m in ex.logs.stdout) == "Hello from TypeScript!\n2 + 2 = 4\n"
        ex = ci.codes.run("interface Person {\n  name: string;\n  age: number;\n}\n"
                          "const person: Person = { name: 'John', age: 30 };\nperson.age + result", context=ts)
        assert [r.text for r in ex.result] == ["34"], "types stripped, state kept"
        ex = ci.codes.run("throw new Error('ts-runtime-error');", context=ts)
        assert ex.error is not None and ex.error.value == "ts-runtime-error", ex.error
    finally:
        ci.close()


def test_a_missing_interpreter_is_a_clear_error(server, make_sandbox):
    if not local_runtime(server):
        pytest.skip("the sandbox's entrypoint and PATH are the local runtime's here")
    # No interpreter can be found on this PATH: the error names it, at once.
    sb = make_sandbox(env={"PATH": "/nonexistent"}, entrypoint=["/usr/bin/tail", "-f", "/dev/null"])
    ci = CodeInterpreterSync.create(sb, skip_health_check=True)
    try:
        t0 = time.monotonic()
        for language, interpreter in (("python", "python3"), ("javascript", "node")):
            with pytest.raises(SandboxException) as e:
                ci.codes.create_context(language)
            assert interpreter in str(e.value), str(e.value)
        assert time.monotonic() - t0 < 10
    finally:
        ci.close()


def test_contexts_run_concurrently_and_stay_apart(interpreter):
    a = interpreter.codes.create_context(SupportedLanguage.PYTHON)
    b = interpreter.codes.create_context(SupportedLanguage.PYTHON)
    interpreter.codes.run("name = 'a'", context=a)

    def slow(ctx):
        return interpreter.codes.run("import time\ntime.sleep(1)\n'done'", context=ctx)

    t0 = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(slow, [a, b]))
    assert [[r.text for r in ex.result] for ex in results] == [["'done'"], ["'done'"]]
    assert time.monotonic() - t0 < 1.9, "two contexts ran one after the other"
    ex = interpreter.codes.run("name", context=b)
    assert ex.error is not None and ex.error.name == "NameError", "contexts share no state"


def test_the_async_sdk_runs_code_too(server, mode):
    async def flow():
        cfg = ConnectionConfig(
            domain=server.domain,
            api_key=server.api_key,
            use_server_proxy=(mode == "proxy"),
            request_timeout=timedelta(seconds=60),
        )
        sb = await Sandbox.create(IMAGE, connection_config=cfg, timeout=timedelta(minutes=5))
        try:
            if (await sb.commands.run("command -v python3")).exit_code != 0:
                pytest.skip(f"the image {IMAGE!r} has no python3")
            ci = await CodeInterpreter.create(sb)
            ctx = await ci.codes.create_context(SupportedLanguage.PYTHON)
            await ci.codes.run("v = 6", context=ctx)
            ex = await ci.codes.run("print('async')\nv * 7", context=ctx)
            assert [m.text for m in ex.logs.stdout] == ["async\n"]
            assert [r.text for r in ex.result] == ["42"]
        finally:
            await sb.kill()
            await sb.close()

    asyncio.run(flow())
