// Paddock's Java code-interpreter driver: one per context, run from source by `java` (the
// single-file launcher, Java 11+), keeping state in a JShell (jdk.jshell) whose snippets run in
// a JVM of their own. Requests are JSON lines on stdin ({"code": ...}); replies are marker
// lines, MARK + JSON, on the same streams as the user's output so they arrive after it.
// A cell is split into snippets as jshell would (SourceCodeAnalysis) and run one by one; the
// value of the last expression is the cell's result, the first failure its error.
import java.io.BufferedReader;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.stream.Collectors;
import jdk.jshell.Diag;
import jdk.jshell.EvalException;
import jdk.jshell.JShell;
import jdk.jshell.JShellException;
import jdk.jshell.Snippet;
import jdk.jshell.SnippetEvent;
import jdk.jshell.SourceCodeAnalysis;

public class PaddockDriver {
    static String mark;
    static PrintStream out;
    static PrintStream err;

    static String quote(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                default:
                    if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
                    else b.append(c);
            }
        }
        return b.append('"').toString();
    }

    static void reply(PrintStream to, String json) {
        to.flush();
        to.print(mark + json + "\n");
        to.flush();
    }

    static String error(String name, String value, List<String> traceback) {
        String tb = traceback.stream().map(PaddockDriver::quote).collect(Collectors.joining(","));
        return "{\"t\":\"error\",\"ename\":" + quote(name) + ",\"evalue\":" + quote(value) + ",\"traceback\":[" + tb + "]}";
    }

    /** The code of a request line: the one field, read without a JSON library. */
    static String codeOf(String line) {
        int at = line.indexOf("\"code\"");
        if (at < 0) return "";
        int i = line.indexOf('"', line.indexOf(':', at) + 1) + 1;
        StringBuilder b = new StringBuilder();
        while (i < line.length()) {
            char c = line.charAt(i++);
            if (c == '"') break;
            if (c != '\\') { b.append(c); continue; }
            char e = line.charAt(i++);
            switch (e) {
                case 'n': b.append('\n'); break;
                case 'r': b.append('\r'); break;
                case 't': b.append('\t'); break;
                case 'b': b.append('\b'); break;
                case 'f': b.append('\f'); break;
                case 'u': b.append((char) Integer.parseInt(line.substring(i, i + 4), 16)); i += 4; break;
                default: b.append(e);
            }
        }
        return b.toString();
    }

    static String run(JShell js, String code) {
        SourceCodeAnalysis analysis = js.sourceCodeAnalysis();
        String rest = code;
        String result = null;
        while (!rest.isBlank()) {
            SourceCodeAnalysis.CompletionInfo info = analysis.analyzeCompletion(rest);
            String source = info.completeness().isComplete() ? info.source() : rest;
            rest = info.completeness().isComplete() ? info.remaining() : "";
            if (source == null || source.isBlank()) break;
            result = null;
            for (SnippetEvent ev : js.eval(source)) {
                if (ev.causeSnippet() != null) continue;
                JShellException ex = ev.exception();
                if (ex != null) {
                    // As the IJava kernel reports it: the name is the JShell exception's, the
                    // value names what the code threw.
                    String thrown = ex instanceof EvalException ? ((EvalException) ex).getExceptionClassName()
                        : ex.getClass().getName();
                    String value = thrown + (ex.getMessage() == null ? "" : ": " + ex.getMessage());
                    List<String> tb = new ArrayList<>();
                    tb.add(value);
                    for (StackTraceElement e : ex.getStackTrace()) tb.add("\tat " + e);
                    return error(ex.getClass().getSimpleName(), value, tb);
                }
                if (ev.status() == Snippet.Status.REJECTED) {
                    List<String> lines = js.diagnostics(ev.snippet())
                        .map(d -> d.getMessage(null)).collect(Collectors.toList());
                    String value = lines.isEmpty() ? "the snippet was rejected" : lines.get(0);
                    return error("CompilationError", value, lines);
                }
                Snippet.Kind kind = ev.snippet().kind();
                if (kind == Snippet.Kind.EXPRESSION || (kind == Snippet.Kind.VAR && ev.value() != null
                        && ev.snippet().subKind() == Snippet.SubKind.TEMP_VAR_EXPRESSION_SUBKIND)) {
                    result = ev.value();
                }
            }
        }
        return result == null ? null : "{\"t\":\"result\",\"data\":{\"text/plain\":" + quote(result) + "}}";
    }

    public static void main(String[] args) throws Exception {
        // The launcher wrote this source to a directory of its own, of no use once compiled.
        if (args.length == 1) {
            java.io.File dir = new java.io.File(args[0]);
            new java.io.File(dir, "PaddockDriver.java").delete();
            dir.delete();
        }
        mark = "\u001ePADDOCK-" + System.getenv().getOrDefault("PADDOCK_CODE_NONCE", "") + " ";
        out = new PrintStream(new FileOutputStream(FileDescriptor.out), true, StandardCharsets.UTF_8);
        err = new PrintStream(new FileOutputStream(FileDescriptor.err), true, StandardCharsets.UTF_8);
        JShell js = JShell.builder().out(out).err(err).build();
        // An interrupt stops the running snippet (the server sends SIGINT); the context lives on.
        sun.misc.Signal.handle(new sun.misc.Signal("INT"), s -> js.stop());
        // The interrupt's SIGINT reaches the whole process group, the JVM that runs the
        // snippets too, whose default is to exit: there it does nothing (this JVM's handler
        // stops the snippet). This also warms the JShell up for the first cell.
        js.eval("sun.misc.Signal.handle(new sun.misc.Signal(\"INT\"), s -> {});");
        js.drop(js.snippets().filter(sn -> true).reduce((a, b) -> b).orElseThrow());
        reply(out, "{\"t\":\"ready\"}");
        reply(err, "{\"t\":\"ready\"}");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String r;
            try {
                r = run(js, codeOf(line));
            } catch (RuntimeException e) {
                r = error(e.getClass().getName(), String.valueOf(e.getMessage()), List.of());
            }
            if (r != null) reply(out, r);
            reply(out, "{\"t\":\"done\"}");
            reply(err, "{\"t\":\"done\"}");
        }
        js.close();
        System.exit(0);
    }
}
