//! The execd routes in `/v1/openapi.json`, as the server proxies them:
//! `/sandboxes/{id}/proxy/44772/<route>`. Written next to the router (`execd::router`), and a
//! test reads the router's own source so that a route added there without a description here
//! fails the build's tests.

use serde_json::{Value, json};

/// The execd routes: path below the proxy, method, summary, query parameters, request body
/// schema (JSON unless noted) and the success status.
struct Route {
    path: &'static str,
    method: &'static str,
    summary: &'static str,
    query: &'static [(&'static str, &'static str, bool)],
    body: Option<Value>,
    ok: &'static str,
}

fn routes() -> Vec<Route> {
    let string_map = json!({"type": "object", "additionalProperties": {"type": "string"}});
    let perm = json!({"type": "object", "additionalProperties": {"type": "object", "additionalProperties": false,
        "properties": {"mode": {"type": "integer", "description": "octal digits written as a number, e.g. 644"},
            "owner": {"type": "string", "description": "a user of the sandbox (name or id), not root"}, "group": {"type": "string", "description": "a group of the sandbox (name or id), not root"}}}});
    let r = |path, method, summary, query, body, ok| Route { path, method, summary, query, body, ok };
    vec![
        r("/ping", "get", "Whether the sandbox answers", &[], None, "200"),
        r(
            "/command",
            "post",
            "Run a command; its output as server-sent events (init, stdout, stderr, execution_complete or error)",
            &[],
            Some(
                json!({"type": "object", "properties": {"command": {"type": "string"}, "argv": {"type": "array", "items": {"type": "string"}},
                "cwd": {"type": "string"}, "background": {"type": "boolean"}, "timeout": {"type": "integer", "description": "milliseconds"},
                "envs": string_map, "uid": {"type": "integer"}, "gid": {"type": "integer"}}}),
            ),
            "200",
        ),
        r(
            "/command",
            "delete",
            "Interrupt a command (SIGINT, then SIGKILL)",
            &[("id", "the command id from its init event", true)],
            None,
            "200",
        ),
        r("/command/status/{cmd}", "get", "A command's status: running, exit code, times", &[], None, "200"),
        r(
            "/command/{cmd}/logs",
            "get",
            "A background command's output so far, from a cursor",
            &[("cursor", "where the last read ended", false)],
            None,
            "200",
        ),
        r("/files", "delete", "Delete files", &[("path", "a file to delete (repeatable)", true)], None, "200"),
        r(
            "/files/info",
            "get",
            "Files' type, size, mode, owner and times",
            &[("path", "a path (repeatable)", true)],
            None,
            "200",
        ),
        r(
            "/files/upload",
            "post",
            "Write files: multipart parts `metadata` ({path, mode, owner, group}) then `file`, per file",
            &[],
            None,
            "200",
        ),
        r(
            "/files/download",
            "get",
            "A file's bytes (Range: bytes=; or lines with offset and limit)",
            &[
                ("path", "the file", true),
                ("offset", "first line (line mode)", false),
                ("limit", "how many lines (line mode)", false),
            ],
            None,
            "200",
        ),
        r(
            "/files/mv",
            "post",
            "Move or rename files",
            &[],
            Some(
                json!({"type": "array", "items": {"type": "object", "required": ["src", "dest"], "properties": {"src": {"type": "string"}, "dest": {"type": "string"}}}}),
            ),
            "200",
        ),
        r("/files/permissions", "post", "Set files' mode and owner", &[], Some(perm.clone()), "200"),
        r(
            "/files/search",
            "get",
            "Files below a directory whose name matches a glob",
            &[("path", "the directory", true), ("pattern", "a glob, ** by default", false)],
            None,
            "200",
        ),
        r(
            "/files/replace",
            "post",
            "Replace text in files",
            &[("verbose", "true: count the replacements", false)],
            Some(json!({"type": "object", "additionalProperties": {"type": "object", "required": ["old", "new"],
                "properties": {"old": {"type": "string"}, "new": {"type": "string"}}}})),
            "200",
        ),
        r("/directories", "post", "Make directories (mkdir -p)", &[], Some(perm), "200"),
        r(
            "/directories",
            "delete",
            "Delete directories and what they hold",
            &[("path", "a directory (repeatable)", true)],
            None,
            "200",
        ),
        r(
            "/directories/list",
            "get",
            "A directory's entries, to a depth",
            &[("path", "the directory", true), ("depth", "levels, 1 by default", false)],
            None,
            "200",
        ),
        r("/metrics", "get", "The sandbox's CPU and memory use", &[], None, "200"),
        r(
            "/code",
            "post",
            "Run code in a context; output, results and errors as server-sent events",
            &[],
            Some(json!({"type": "object", "properties": {"code": {"type": "string"}, "context": {"type": "object",
                "properties": {"id": {"type": "string"}, "language": {"type": "string", "enum": ["python", "javascript", "typescript", "java", "go", "bash"]}}}}})),
            "200",
        ),
        r("/code", "delete", "Interrupt what a context runs", &[("id", "the context id", true)], None, "200"),
        r(
            "/code/context",
            "post",
            "Make a code context (Python, JavaScript or Bash) whose state lasts between runs",
            &[],
            Some(json!({"type": "object", "properties": {"language": {"type": "string"}, "cwd": {"type": "string"}}})),
            "200",
        ),
        r("/code/contexts", "get", "The code contexts", &[("language", "only this language's", false)], None, "200"),
        r(
            "/code/contexts",
            "delete",
            "Delete a language's code contexts",
            &[("language", "the language", true)],
            None,
            "200",
        ),
        r("/code/contexts/{context}", "get", "One code context", &[], None, "200"),
        r("/code/contexts/{context}", "delete", "Delete one code context", &[], None, "200"),
        r(
            "/session",
            "post",
            "Make a bash session whose working directory and environment last between runs",
            &[],
            Some(json!({"type": "object", "properties": {"cwd": {"type": "string"}}})),
            "200",
        ),
        r(
            "/session/{session}/run",
            "post",
            "Run a command in a session; output as server-sent events",
            &[],
            Some(json!({"type": "object", "properties": {"command": {"type": "string"}, "cwd": {"type": "string"},
                "timeout": {"type": "integer", "description": "milliseconds"}}})),
            "200",
        ),
        r("/session/{session}", "delete", "End a session", &[], None, "200"),
    ]
}

/// The execd paths for `/v1/openapi.json`, keyed as the lifecycle paths are (below `/v1`).
pub fn paths() -> Value {
    let error_ref = json!({"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}});
    let mut out = serde_json::Map::new();
    for route in routes() {
        let full = format!("/sandboxes/{{id}}/proxy/{}{}", crate::api::EXECD_PORT, route.path);
        let mut params = vec![json!({"name": "id", "in": "path", "required": true, "schema": {"type": "string"}})];
        for name in ["cmd", "context", "session"] {
            if route.path.contains(&format!("{{{name}}}")) {
                params.push(json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}));
            }
        }
        for (name, what, required) in route.query {
            params.push(json!({"name": name, "in": "query", "required": required, "description": what, "schema": {"type": "string"}}));
        }
        let mut op = json!({
            "summary": route.summary,
            "tags": ["execd"],
            "parameters": params,
            "security": [{"apiKey": []}, {"sandboxToken": []}],
            "responses": {route.ok: {"description": "Done"}, "400": error_ref.clone(), "401": error_ref.clone(),
                "404": error_ref.clone()},
        });
        if let Some(schema) = route.body {
            op["requestBody"] = json!({"required": true, "content": {"application/json": {"schema": schema}}});
        } else if route.path == "/files/upload" {
            op["requestBody"] =
                json!({"required": true, "content": {"multipart/form-data": {"schema": {"type": "object"}}}});
        }
        let entry = out.entry(full).or_insert_with(|| json!({}));
        entry[route.method] = op;
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `.route("/path", method(...))` in the execd router is described, and nothing is
    /// described that the router does not serve.
    #[test]
    fn every_execd_route_is_documented_and_only_those() {
        let source = include_str!("../execd.rs");
        let router = &source[source.find("pub fn router").expect("the execd router")..];
        let router = &router[..router.find("\n}\n").expect("its end")];
        let mut served = Vec::new();
        for line in router.lines().map(str::trim).filter(|l| l.starts_with(".route(\"")) {
            let path = line.trim_start_matches(".route(\"").split('"').next().unwrap();
            if path == "/" || path == "/{*rest}" {
                continue;
            }
            let methods = &line[line.find(',').unwrap()..];
            for m in ["get", "post", "delete", "put", "patch"] {
                let calls = [format!("{m}("), format!("routing::{m}("), format!(".{m}(")];
                if calls.iter().any(|c| methods.contains(c.as_str())) {
                    served.push((path.to_owned(), m.to_owned()));
                }
            }
        }
        served.sort();
        served.dedup();
        let mut documented: Vec<(String, String)> =
            routes().iter().map(|r| (r.path.to_owned(), r.method.to_owned())).collect();
        documented.sort();
        assert!(served.len() > 20, "the router's source was not read right: {served:?}");
        assert_eq!(served, documented);
    }
}
