//! `/files` and `/directories`: every operation is a `Runtime::file` call, so paths resolve in
//! the sandbox's own view (relative ones under `/workspace`) with the sandbox user's rights.
//! File contents stream through the runtime's byte streams in both directions.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path as FsPath;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::multipart::{Field, MultipartRejection};
use axum::extract::{Multipart, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use paddock_core::runtime::{FileErrorKind, FileKind, FileOp, FileOwner, FileReply, FileStat, RuntimeError, SandboxId};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;

use super::ExecdState;
use super::text::{
    BadRange, ByteRange, NameGlob, format_mode, parse_mode, parse_query, parse_range, query_all, query_one,
};
use super::{InSandbox, Names, invalid_body, missing_query};
use crate::error::{ApiError, ApiResult};
use crate::time_fmt::rfc3339;

/// Most entries a listing or search returns; beyond it the caller must narrow the request.
const MAX_ENTRIES: usize = 100_000;
/// Directories listed at once during a walk.
const WALK_PARALLELISM: usize = 16;
/// Largest metadata part of an upload.
const MAX_METADATA: usize = 64 << 10;
/// Largest file `/files/replace` edits (it holds the file in memory) and largest symlinked file
/// served with a range (its size is unknown until read).
const MAX_IN_MEMORY: usize = 64 << 20;
const CHUNK: usize = 64 << 10;

fn not_supported(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "NOT_SUPPORTED", message)
}

fn json_body<T: serde::de::DeserializeOwned>(body: &[u8], shape: &str) -> ApiResult<T> {
    serde_json::from_slice(body).map_err(|e| invalid_body(format!("invalid request body: {e}: expected {shape}")))
}

async fn stat(state: &ExecdState, sandbox: &SandboxId, path: &str) -> Result<FileStat, RuntimeError> {
    match state.rt.file(sandbox, FileOp::Stat { path: path.to_owned() }).await? {
        FileReply::Stat(s) => Ok(s),
        other => Err(RuntimeError::System(format!("unexpected answer to a stat: {other:?}"))),
    }
}

/// `Ok(None)` when the path does not exist.
async fn stat_opt(state: &ExecdState, sandbox: &SandboxId, path: &str) -> ApiResult<Option<FileStat>> {
    match stat(state, sandbox, path).await {
        Ok(s) => Ok(Some(s)),
        Err(RuntimeError::File { kind: FileErrorKind::NotFound, .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

async fn run_op(state: &ExecdState, sandbox: &SandboxId, op: FileOp) -> ApiResult<()> {
    state.rt.file(sandbox, op).await?;
    Ok(())
}

/// Reads a whole (small) file of the sandbox; more than `cap` bytes is an error.
pub(super) async fn read_small(state: &ExecdState, sandbox: &SandboxId, path: &str, cap: usize) -> ApiResult<Vec<u8>> {
    Ok(read_held(state, sandbox, path, cap).await?.data)
}

/// Bytes read into memory, with the room they take in the server's budget (given back when
/// this is dropped).
pub(super) struct Held {
    pub data: Vec<u8>,
    _room: Vec<tokio::sync::OwnedSemaphorePermit>,
}

/// Reads a whole file of at most `cap` bytes, reserving room in the server's memory budget as
/// it grows (a file's size is only a hint: it may grow, or be a device that never ends).
pub(super) async fn read_held(state: &ExecdState, sandbox: &SandboxId, path: &str, cap: usize) -> ApiResult<Held> {
    const STEP: usize = 1 << 20;
    let mut rx = state.rt.read_file(sandbox, path).await?;
    let mut out = Vec::new();
    let mut room = Vec::new();
    let mut reserved = 0usize;
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = rx.read(&mut buf).await.map_err(|e| ApiError::unavailable(format!("reading {path}: {e}")))?;
        if n == 0 {
            return Ok(Held { data: out, _room: room });
        }
        if out.len() + n > cap {
            return Err(too_big(path, cap));
        }
        if out.len() + n > reserved {
            let more = STEP.max(n);
            room.push(state.budget.reserve(more as u64, &format!("reading {path}")).await?);
            reserved += more;
        }
        out.extend_from_slice(&buf[..n]);
    }
}

fn too_big(path: &str, cap: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "FILE_TOO_LARGE",
        format!("{path} is larger than {cap} bytes, the most this operation handles"),
    )
}

/// Writes `data` to a file of the sandbox, replacing it.
async fn write_small(
    state: &ExecdState,
    sandbox: &SandboxId,
    path: &str,
    mode: Option<u32>,
    data: Vec<u8>,
) -> ApiResult<()> {
    state.rt.write_file(sandbox, path, mode, Box::new(std::io::Cursor::new(data))).await?;
    Ok(())
}

/// The sandbox's user and group names, read once per sandbox; ids stand in when unreadable.
async fn names(state: &ExecdState, sandbox: &SandboxId) -> Arc<Names> {
    if let Some(n) = state.commands.cached_names(sandbox) {
        return n;
    }
    let (passwd, group) = tokio::join!(
        read_small(state, sandbox, "/etc/passwd", 4 << 20),
        read_small(state, sandbox, "/etc/group", 4 << 20)
    );
    let db = |r: ApiResult<Vec<u8>>| r.map(|b| Names::parse_db(&String::from_utf8_lossy(&b))).unwrap_or_default();
    let names = Arc::new(Names { users: db(passwd), groups: db(group) });
    state.commands.cache_names(sandbox, names.clone());
    names
}

/// Owners a file can be given through the API, from the names (or ids) a request gives: the
/// sandbox's user and group, `nobody` / `nogroup` (65534), or any other user or group of the
/// sandbox's `/etc/passwd` and `/etc/group`, or id, but root. `None` when neither is asked.
async fn wanted_owner(
    state: &ExecdState,
    sandbox: &SandboxId,
    owner: Option<&str>,
    group: Option<&str>,
) -> ApiResult<Option<(Option<FileOwner>, Option<FileOwner>)>> {
    let (owner, group) = (owner.filter(|s| !s.is_empty()), group.filter(|s| !s.is_empty()));
    if owner.is_none() && group.is_none() {
        return Ok(None);
    }
    let user = state.rt.get(sandbox).await?.spec.user;
    let names = names(state, sandbox).await;
    let user_owner = owner.map(|o| file_owner(o, user.uid, &names.users, "user", "/etc/passwd")).transpose()?;
    let group_owner = group.map(|g| file_owner(g, user.gid, &names.groups, "group", "/etc/group")).transpose()?;
    Ok(Some((user_owner, group_owner)))
}

/// The owner `given` (a name from the sandbox's `db`, or an id) names; `mine` is the sandbox's
/// own id.
fn file_owner(given: &str, mine: u32, db: &HashMap<u32, String>, what: &str, file: &str) -> ApiResult<FileOwner> {
    const NOBODY: u32 = FileOwner::MAX_ID;
    let id = match given.parse::<u32>() {
        Ok(id) => id,
        // A name that several ids share stands for the lowest of them.
        Err(_) => match db.iter().filter(|(_, name)| *name == given).map(|(id, _)| *id).min() {
            Some(id) => id,
            None if given == "nobody" || given == "nogroup" => NOBODY,
            None if given == "root" => 0,
            None => {
                return Err(ApiError::bad_request(format!(
                    "no {what} named {given:?} exists in the sandbox (its {file}): give a name from it or a numeric id from 1 to {NOBODY}"
                )));
            }
        },
    };
    Ok(match id {
        id if id == mine => FileOwner::SandboxUser,
        NOBODY => FileOwner::Nobody,
        id => {
            if let Some(why) = FileOwner::refusal(id) {
                return Err(not_supported(format!("cannot give a file to {what} {given:?}: {why}")));
            }
            FileOwner::Id(id)
        }
    })
}

/// Gives `path` the owners [`wanted_owner`] found, if any.
async fn apply_owner(
    state: &ExecdState,
    sandbox: &SandboxId,
    path: &str,
    wanted: Option<(Option<FileOwner>, Option<FileOwner>)>,
) -> ApiResult<()> {
    if let Some((user, group)) = wanted {
        run_op(state, sandbox, FileOp::Chown { path: path.to_owned(), user, group }).await?;
    }
    Ok(())
}

#[derive(Serialize)]
struct FileInfo {
    path: String,
    #[serde(rename = "type")]
    kind: &'static str,
    size: u64,
    modified_at: String,
    created_at: String,
    owner: String,
    group: String,
    mode: u32,
}

fn file_info(s: FileStat, names: &Names) -> FileInfo {
    let modified = rfc3339(s.modified_unix_ms);
    FileInfo {
        kind: match s.kind {
            FileKind::File => "file",
            FileKind::Dir => "directory",
            FileKind::Symlink => "symlink",
            FileKind::Other => "other",
        },
        size: s.size,
        // The runtime reports no birth time; the modification time is the closest it has.
        created_at: modified.clone(),
        modified_at: modified,
        owner: names.user(s.uid),
        group: names.group(s.gid),
        mode: format_mode(s.mode),
        path: s.path,
    }
}

/// `GET /files/info?path=a&path=b` → `{"a": FileInfo, "b": FileInfo}`.
pub async fn info(
    State(state): State<ExecdState>,
    InSandbox(sandbox, _): InSandbox,
    RawQuery(raw): RawQuery,
) -> ApiResult<Response> {
    let q = parse_query(raw.as_deref());
    let mut out = BTreeMap::new();
    let paths = query_all(&q, "path");
    if paths.is_empty() {
        return Ok(axum::Json(out).into_response());
    }
    let names = names(&state, &sandbox).await;
    for path in paths {
        let s = stat(&state, &sandbox, path).await?;
        out.insert(path.to_owned(), file_info(s, &names));
    }
    Ok(axum::Json(out).into_response())
}

/// `DELETE /files?path=…`: removes files; missing ones are fine, directories are refused.
pub async fn remove_files(
    State(state): State<ExecdState>,
    InSandbox(sandbox, _): InSandbox,
    RawQuery(raw): RawQuery,
) -> ApiResult<StatusCode> {
    let q = parse_query(raw.as_deref());
    for path in query_all(&q, "path") {
        match stat_opt(&state, &sandbox, path).await? {
            None => {}
            Some(s) if s.kind == FileKind::Dir => {
                return Err(ApiError::bad_request(format!(
                    "{path} is a directory: remove it with DELETE /directories?path=…"
                )));
            }
            Some(_) => match run_op(&state, &sandbox, FileOp::Remove { path: path.to_owned(), recursive: false }).await
            {
                Err(e) if e.status == StatusCode::NOT_FOUND => {}
                r => r?,
            },
        }
    }
    Ok(StatusCode::OK)
}

/// `DELETE /directories?path=…`: removes directories recursively; missing ones are fine.
pub async fn remove_dirs(
    State(state): State<ExecdState>,
    InSandbox(sandbox, _): InSandbox,
    RawQuery(raw): RawQuery,
) -> ApiResult<StatusCode> {
    let q = parse_query(raw.as_deref());
    for path in query_all(&q, "path") {
        match state.rt.file(&sandbox, FileOp::Remove { path: path.to_owned(), recursive: true }).await {
            Ok(_) | Err(RuntimeError::File { kind: FileErrorKind::NotFound, .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(StatusCode::OK)
}

#[derive(Deserialize)]
struct RenameItem {
    src: String,
    dest: String,
}

/// `POST /files/mv` `[{src, dest}]`: the destination must not exist; its parents are created.
pub async fn rename(
    State(state): State<ExecdState>,
    InSandbox(sandbox, _): InSandbox,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let items: Vec<RenameItem> = json_body(&body, r#"[{"src": "...", "dest": "..."}]"#)?;
    for item in items {
        stat(&state, &sandbox, &item.src).await?;
        if stat_opt(&state, &sandbox, &item.dest).await?.is_some() {
            return Err(ApiError::conflict(format!("destination {} already exists: remove it first", item.dest)));
        }
        run_op(&state, &sandbox, FileOp::Move { from: item.src, to: item.dest }).await?;
    }
    Ok(StatusCode::OK)
}

#[derive(Deserialize, Default)]
struct Permission {
    mode: Option<i64>,
    owner: Option<String>,
    group: Option<String>,
}

/// The mode asked for. Set-user-id and set-group-id bits are refused rather than dropped in
/// silence: no sandbox filesystem honours them (all are nosuid, and the kernel clears them on
/// files the sandbox user makes), so answering 200 would say something was done that was not.
fn mode_of(p: &Permission) -> ApiResult<Option<u32>> {
    let mode = parse_mode(p.mode.unwrap_or(0)).map_err(invalid_body)?;
    if let Some(m) = mode
        && m & 0o6000 != 0
    {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "SETID_NOT_ALLOWED",
            format!(
                "mode {:o} has the set-user-id or set-group-id bit, which no file in a sandbox may have: give it without them ({:o})",
                m,
                m & !0o6000
            ),
        ));
    }
    Ok(mode)
}

/// `POST /files/permissions` `{path: {mode, owner?, group?}}`.
pub async fn chmod(
    State(state): State<ExecdState>,
    InSandbox(sandbox, _): InSandbox,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let request: BTreeMap<String, Permission> = json_body(&body, r#"{"/path": {"mode": 644}}"#)?;
    for (path, p) in request {
        let mode = mode_of(&p)?;
        let owner = wanted_owner(&state, &sandbox, p.owner.as_deref(), p.group.as_deref()).await?;
        // The mode is changed as the sandbox user: a file of nobody's is taken back first,
        // then given to whom the request says.
        if owner.is_some() && mode.is_some() {
            let mine = Some((Some(FileOwner::SandboxUser), Some(FileOwner::SandboxUser)));
            apply_owner(&state, &sandbox, &path, mine).await?;
        }
        match mode {
            Some(mode) => run_op(&state, &sandbox, FileOp::Chmod { path: path.clone(), mode }).await?,
            None => drop(stat(&state, &sandbox, &path).await?),
        }
        apply_owner(&state, &sandbox, &path, owner).await?;
    }
    Ok(StatusCode::OK)
}

/// `POST /directories` `{path: {mode}}`: `mkdir -p`; the mode applies to a directory it creates.
pub async fn make_dirs(
    State(state): State<ExecdState>,
    InSandbox(sandbox, _): InSandbox,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let request: BTreeMap<String, Permission> = json_body(&body, r#"{"/path": {"mode": 755}}"#)?;
    for (path, p) in request {
        let mode = mode_of(&p)?;
        let owner = wanted_owner(&state, &sandbox, p.owner.as_deref(), p.group.as_deref()).await?;
        match stat_opt(&state, &sandbox, &path).await? {
            Some(s) if s.kind == FileKind::Dir => {}
            Some(_) => return Err(ApiError::conflict(format!("{path} exists and is not a directory"))),
            None => run_op(&state, &sandbox, FileOp::Mkdir { path: path.clone(), mode }).await?,
        }
        apply_owner(&state, &sandbox, &path, owner).await?;
    }
    Ok(StatusCode::OK)
}

/// Lists `root` and its subdirectories down to `max_depth` levels (all when `None`), without
/// following symlinks, in the order of a depth-first walk with sorted names.
async fn walk(
    state: &ExecdState,
    sandbox: &SandboxId,
    root: &str,
    max_depth: Option<usize>,
) -> ApiResult<Vec<FileStat>> {
    let mut out = Vec::new();
    if max_depth == Some(0) {
        return Ok(out);
    }
    let mut pending = VecDeque::from([(root.to_owned(), 1usize)]);
    let mut running = JoinSet::new();
    loop {
        while running.len() < WALK_PARALLELISM {
            let Some((dir, depth)) = pending.pop_front() else { break };
            let (state, sandbox) = (state.clone(), sandbox.clone());
            running.spawn(async move {
                let r = state.rt.file(&sandbox, FileOp::List { path: dir.clone() }).await;
                (dir, depth, r)
            });
        }
        let Some(joined) = running.join_next().await else { break };
        let (dir, depth, listed) = joined.map_err(|e| ApiError::internal(format!("listing a directory: {e}")))?;
        let entries = match listed {
            Ok(FileReply::List { entries }) => entries,
            // Below the root, a directory that vanished or is unreadable is skipped, not fatal.
            Err(RuntimeError::File { kind: FileErrorKind::NotFound | FileErrorKind::PermissionDenied, .. })
                if depth > 1 =>
            {
                continue;
            }
            Err(e) => return Err(e.into()),
            Ok(other) => return Err(ApiError::internal(format!("unexpected answer to a listing of {dir}: {other:?}"))),
        };
        for e in entries {
            if e.kind == FileKind::Dir && max_depth.is_none_or(|m| depth < m) {
                pending.push_back((e.path.clone(), depth + 1));
            }
            out.push(e);
        }
        if out.len() > MAX_ENTRIES {
            return Err(ApiError::bad_request(format!(
                "{root} holds more than {MAX_ENTRIES} entries: list a smaller depth or a subdirectory"
            )));
        }
    }
    // Path ordering is by components, which is exactly depth-first order with sorted names.
    out.sort_by(|a, b| FsPath::new(&a.path).cmp(FsPath::new(&b.path)));
    Ok(out)
}

/// `GET /directories/list?path=&depth=` (depth 1 by default: the directory's own entries).
pub async fn list(
    State(state): State<ExecdState>,
    InSandbox(sandbox, _): InSandbox,
    RawQuery(raw): RawQuery,
) -> ApiResult<Response> {
    let q = parse_query(raw.as_deref());
    let path = query_one(&q, "path").ok_or_else(|| missing_query("path", "the directory to list"))?;
    let depth = match query_one(&q, "depth") {
        None => 1,
        Some(d) => d.parse::<usize>().map_err(|_| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "INVALID_REQUEST_BODY",
                format!("invalid query parameter 'depth': {d}: give a number of levels, 1 for the directory itself"),
            )
        })?,
    };
    let root = stat(&state, &sandbox, path).await?;
    match root.kind {
        FileKind::Dir => {}
        FileKind::Symlink => {
            return Err(ApiError::bad_request(format!("{path} is a symbolic link, refusing to traverse")));
        }
        _ => return Err(ApiError::bad_request(format!("{path} is not a directory"))),
    }
    let entries = walk(&state, &sandbox, &root.path, Some(depth)).await?;
    let names = names(&state, &sandbox).await;
    Ok(axum::Json(entries.into_iter().map(|s| file_info(s, &names)).collect::<Vec<_>>()).into_response())
}

/// `GET /files/search?path=&pattern=`: files (not directories) below `path` whose name matches
/// the glob (`**` by default).
pub async fn search(
    State(state): State<ExecdState>,
    InSandbox(sandbox, _): InSandbox,
    RawQuery(raw): RawQuery,
) -> ApiResult<Response> {
    let q = parse_query(raw.as_deref());
    let path = query_one(&q, "path").ok_or_else(|| missing_query("path", "the directory to search"))?;
    let pattern = NameGlob::new(query_one(&q, "pattern").unwrap_or("**"));
    let root = stat(&state, &sandbox, path).await?;
    let names = names(&state, &sandbox).await;
    if root.kind != FileKind::Dir {
        let name = FsPath::new(&root.path).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let hit = pattern.matches(&name).then(|| file_info(root, &names));
        return Ok(axum::Json(hit.into_iter().collect::<Vec<_>>()).into_response());
    }
    let found: Vec<_> = walk(&state, &sandbox, &root.path, None)
        .await?
        .into_iter()
        .filter(|s| s.kind != FileKind::Dir)
        .filter(|s| FsPath::new(&s.path).file_name().is_some_and(|n| pattern.matches(&n.to_string_lossy())))
        .map(|s| file_info(s, &names))
        .collect();
    Ok(axum::Json(found).into_response())
}

#[derive(Deserialize)]
struct ReplaceItem {
    old: String,
    new: String,
}

#[derive(Serialize)]
struct ReplaceResult {
    #[serde(rename = "replacedCount")]
    replaced_count: usize,
}

/// `POST /files/replace[?verbose=true]` `{path: {old, new}}`: replaces every occurrence.
pub async fn replace(
    State(state): State<ExecdState>,
    InSandbox(sandbox, _): InSandbox,
    RawQuery(raw): RawQuery,
    body: Bytes,
) -> ApiResult<Response> {
    let verbose = query_one(&parse_query(raw.as_deref()), "verbose") == Some("true");
    let request: BTreeMap<String, ReplaceItem> = json_body(&body, r#"{"/path": {"old": "...", "new": "..."}}"#)?;
    let mut results = BTreeMap::new();
    for (path, item) in request {
        if item.old.is_empty() {
            return Err(invalid_body("old content must not be empty"));
        }
        let s = stat(&state, &sandbox, &path).await?;
        // The text is held with room reserved as it is read; the edited copy reserves its own
        // exact size below, before it is built.
        let Held { data: content, _room } = read_held(&state, &sandbox, &path, MAX_IN_MEMORY).await?;
        let content = String::from_utf8(content).map_err(|_| {
            ApiError::bad_request(format!("{path} is not UTF-8 text: it cannot be edited by replacement"))
        })?;
        let count = content.matches(&item.old).count();
        // The edited text is built in memory: refuse before allocating what a long replacement
        // of many matches would need.
        let edited_len = (content.len() - count * item.old.len()).saturating_add(count.saturating_mul(item.new.len()));
        if edited_len > MAX_IN_MEMORY {
            return Err(too_big(&format!("{path} after the replacement"), MAX_IN_MEMORY));
        }
        let _edited_room = state.budget.reserve(edited_len as u64, &format!("replacing text in {path}")).await?;
        if count > 0 {
            write_small(&state, &sandbox, &path, Some(s.mode), content.replace(&item.old, &item.new).into_bytes())
                .await?;
        }
        results.insert(path, ReplaceResult { replaced_count: count });
    }
    Ok(if verbose { axum::Json(results).into_response() } else { StatusCode::OK.into_response() })
}

/// How a download is cut: bytes `[start, start+len)`, or lines `offset..offset+limit`
/// (1-based, joined by `\n`, as execd's line mode).
#[derive(Debug, Clone, Copy)]
enum Cut {
    Bytes { start: u64, len: Option<u64> },
    Lines { offset: u64, limit: Option<u64> },
}

/// Applies execd's line mode to streamed bytes: lines are numbered from 1, trailing `\r`s and
/// the `\n` are dropped, the chosen lines are joined with `\n`.
#[derive(Debug)]
struct LineWindow {
    offset: u64,
    limit: Option<u64>,
    line: u64,
    written: u64,
    at_start: bool,
    held_cr: usize,
    done: bool,
}

impl LineWindow {
    fn new(offset: u64, limit: Option<u64>) -> Self {
        Self { offset, limit, line: 0, written: 0, at_start: true, held_cr: 0, done: false }
    }
    fn selected(&self) -> bool {
        self.line >= self.offset
    }
    fn push(&mut self, data: &[u8], out: &mut Vec<u8>) {
        for &b in data {
            if self.done {
                return;
            }
            if self.at_start {
                self.at_start = false;
                self.line += 1;
                if self.selected() {
                    if self.written > 0 {
                        out.push(b'\n');
                    }
                    self.written += 1;
                }
            }
            match b {
                b'\n' => {
                    self.held_cr = 0;
                    self.at_start = true;
                    if self.selected() && self.limit.is_some_and(|l| self.written >= l) {
                        self.done = true;
                    }
                }
                b'\r' => self.held_cr += 1,
                _ if self.selected() => {
                    out.extend(std::iter::repeat_n(b'\r', self.held_cr));
                    self.held_cr = 0;
                    out.push(b);
                }
                _ => self.held_cr = 0,
            }
        }
    }
}

/// Streams the chosen part of a file into the response body; a failure mid-way ends the body
/// with an error, so the client sees a broken transfer rather than a short file.
async fn pump(state: ExecdState, sandbox: SandboxId, path: String, cut: Cut, tx: mpsc::Sender<std::io::Result<Bytes>>) {
    let fail = async |tx: &mpsc::Sender<std::io::Result<Bytes>>, message: String| {
        let _ = tx.send(Err(std::io::Error::other(message))).await;
    };
    let mut rx = match state.rt.read_file(&sandbox, &path).await {
        Ok(rx) => rx,
        Err(e) => return fail(&tx, format!("reading {path}: {e}")).await,
    };
    let tx2 = tx.clone();
    // Ok(true): everything asked for was sent; Ok(false): the client left.
    let copy = async move {
        let mut buf = vec![0u8; CHUNK];
        let mut pos = 0u64;
        let mut sent = 0u64;
        let mut lines = match cut {
            Cut::Lines { offset, limit } => Some(LineWindow::new(offset, limit)),
            Cut::Bytes { .. } => None,
        };
        loop {
            let n = rx.read(&mut buf).await?;
            if n == 0 {
                return Ok::<bool, std::io::Error>(match cut {
                    Cut::Bytes { len: Some(len), .. } => sent == len,
                    _ => true,
                });
            }
            let chunk = match (cut, lines.as_mut()) {
                (_, Some(w)) => {
                    let mut out = Vec::new();
                    w.push(&buf[..n], &mut out);
                    out
                }
                (Cut::Bytes { start, len }, None) => {
                    let (lo, hi) = (pos, pos + n as u64);
                    pos = hi;
                    let from = start.clamp(lo, hi);
                    let to = len.map_or(hi, |l| (start + l).clamp(lo, hi));
                    // Both within this buffer (`lo..hi` is its span): the offsets fit a usize.
                    let at = |x: u64| usize::try_from(x - lo).unwrap_or(buf.len()).min(buf.len());
                    buf[at(from)..at(to)].to_vec()
                }
                (Cut::Lines { .. }, None) => Vec::new(),
            };
            sent += chunk.len() as u64;
            if !chunk.is_empty() && tx2.send(Ok(Bytes::from(chunk))).await.is_err() {
                return Ok(false);
            }
            let finished = match cut {
                Cut::Bytes { len: Some(len), .. } => sent >= len,
                Cut::Lines { .. } => lines.as_ref().is_some_and(|w| w.done),
                Cut::Bytes { len: None, .. } => false,
            };
            // Stopping early drops the stream; the sandbox side then gives up on the rest.
            if finished {
                return Ok(true);
            }
        }
    };
    if let Err(e) = copy.await {
        fail(&tx, format!("reading {path}: {e}")).await;
    }
    // A file that shrank between stat and read leaves the body short of its length; the error
    // above or hyper's length check turns that into a failed transfer.
}

fn content_disposition(path: &str) -> HeaderValue {
    let name = FsPath::new(path).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let ascii = name.bytes().all(|b| b.is_ascii_graphic() || b == b' ') && !name.contains('"') && !name.contains('\\');
    let value = if ascii {
        format!("attachment; filename=\"{name}\"")
    } else {
        let enc: String = name
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        format!("attachment; filename=\"{enc}\"; filename*=UTF-8''{enc}")
    };
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("attachment"))
}

fn positive(q: &[(String, String)], name: &str) -> ApiResult<Option<u64>> {
    match query_one(q, name) {
        None => Ok(None),
        Some(v) => match v.parse::<u64>() {
            Ok(n) if n >= 1 => Ok(Some(n)),
            _ => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "INVALID_REQUEST_BODY",
                format!("invalid query parameter '{name}': {v}: give a number from 1"),
            )),
        },
    }
}

/// `GET /files/download?path=[&offset=&limit=]` with optional `Range: bytes=…`.
pub async fn download(
    State(state): State<ExecdState>,
    InSandbox(sandbox, _): InSandbox,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let q = parse_query(raw.as_deref());
    let path = query_one(&q, "path").ok_or_else(|| missing_query("path", "the file to download"))?.to_owned();
    let (offset, limit) = (positive(&q, "offset")?, positive(&q, "limit")?);
    let range = headers.get(header::RANGE).map(|v| v.to_str().unwrap_or("invalid").to_owned());
    let line_mode = offset.is_some() || limit.is_some();
    if line_mode && range.is_some() {
        return Err(invalid_body(
            "line-based reading (offset/limit) and byte range (Range header) are mutually exclusive",
        ));
    }
    let s = stat(&state, &sandbox, &path).await?;
    match s.kind {
        FileKind::Dir => return Err(ApiError::bad_request(format!("{path} is a directory: list it instead"))),
        FileKind::Other => {
            return Err(ApiError::bad_request(format!(
                "{path} is not a regular file (a device, FIFO or socket): only regular files can be downloaded"
            )));
        }
        FileKind::File | FileKind::Symlink => {}
    }
    // A symlink's own size is not its target's, and kernel files (/proc, /sys) claim 0 bytes
    // yet have content: for those the length is known only once read.
    let size = (s.kind == FileKind::File && s.size > 0).then_some(s.size);
    let mut status = StatusCode::OK;
    let mut response_headers = HeaderMap::new();
    let cut = if line_mode {
        response_headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
        Cut::Lines { offset: offset.unwrap_or(1), limit }
    } else {
        response_headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
        response_headers.insert(header::CONTENT_DISPOSITION, content_disposition(&path));
        response_headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
        match (&range, size) {
            (None, size) => {
                if let Some(size) = size {
                    response_headers.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
                }
                Cut::Bytes { start: 0, len: size }
            }
            (Some(h), Some(size)) => match parse_range(h, size) {
                Ok(ByteRange { start, len }) => {
                    status = StatusCode::PARTIAL_CONTENT;
                    let cr = format!("bytes {start}-{}/{size}", start + len - 1);
                    response_headers.insert(
                        header::CONTENT_RANGE,
                        HeaderValue::from_str(&cr).map_err(|e| ApiError::internal(e.to_string()))?,
                    );
                    response_headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
                    Cut::Bytes { start, len: Some(len) }
                }
                Err(BadRange) => return Err(unsatisfiable(h, size)),
            },
            (Some(h), None) => {
                // Size unknown until read: read it (bounded), then cut.
                let Held { data: mut part, _room } = read_held(&state, &sandbox, &path, MAX_IN_MEMORY).await?;
                let size = part.len() as u64;
                let ByteRange { start, len } = parse_range(h, size).map_err(|_| unsatisfiable(h, size))?;
                // Cut in place: no second copy.
                part.truncate(usize::try_from(start + len).unwrap_or(usize::MAX));
                part.drain(..usize::try_from(start).unwrap_or(part.len()).min(part.len()));
                let cr = format!("bytes {start}-{}/{size}", start + len - 1);
                response_headers.insert(
                    header::CONTENT_RANGE,
                    HeaderValue::from_str(&cr).map_err(|e| ApiError::internal(e.to_string()))?,
                );
                return Ok((StatusCode::PARTIAL_CONTENT, response_headers, part).into_response());
            }
        }
    };
    let (tx, rx) = mpsc::channel(8);
    tokio::spawn(pump(state, sandbox, path, cut, tx));
    Ok((status, response_headers, Body::from_stream(ReceiverStream::new(rx))).into_response())
}

fn unsatisfiable(header: &str, size: u64) -> ApiError {
    ApiError::new(
        StatusCode::RANGE_NOT_SATISFIABLE,
        "INVALID_RANGE",
        format!("range {header:?} cannot be served from a file of {size} bytes: use bytes=START-END within it"),
    )
}

#[derive(Deserialize)]
struct UploadMetadata {
    path: Option<String>,
    owner: Option<String>,
    group: Option<String>,
    mode: Option<i64>,
}

fn upload_error(code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, code, message)
}

fn too_large(limit: u64) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "PAYLOAD_TOO_LARGE",
        format!(
            "the upload is larger than this server accepts ({limit} bytes in all): split it or raise the server's --max-upload"
        ),
    )
}

fn multipart_error(e: &axum::extract::multipart::MultipartError, limit: u64) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return too_large(limit);
    }
    upload_error("INVALID_FILE", format!("malformed multipart upload: {}", e.body_text()))
}

/// A name no one else picks: the upload lands here and is renamed into place once complete.
fn staging_path(path: &str) -> String {
    let (dir, name) = match path.rfind('/') {
        Some(i) => path.split_at(i + 1),
        None => ("", path),
    };
    format!("{dir}.{name}.paddock-upload-{}", super::unique_hex::<6>())
}

fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Why feeding a file part into the sandbox stopped early.
enum FeedError {
    TooLarge,
    Multipart(ApiError),
}

/// `POST /files/upload`: multipart `metadata`/`file` pairs; each file streams into the sandbox
/// through a pipe, lands under a temporary name and is renamed into place once complete, so a
/// failed upload never leaves a truncated file behind.
pub async fn upload(
    State(state): State<ExecdState>,
    InSandbox(sandbox, _): InSandbox,
    multipart: Result<Multipart, MultipartRejection>,
) -> ApiResult<StatusCode> {
    let mut multipart = multipart.map_err(|e| {
        upload_error(
            "INVALID_FILE",
            format!("expected a multipart/form-data body of metadata and file parts: {}", e.body_text()),
        )
    })?;
    let limit = state.config.max_upload_bytes;
    let mut received = 0u64;
    let mut metadata: VecDeque<UploadMetadata> = VecDeque::new();
    let mut files = 0usize;
    while let Some(mut field) = multipart.next_field().await.map_err(|e| multipart_error(&e, limit))? {
        match field.name() {
            Some("metadata") => {
                let mut raw = Vec::new();
                while let Some(chunk) = field.chunk().await.map_err(|e| multipart_error(&e, limit))? {
                    raw.extend_from_slice(&chunk);
                    if raw.len() > MAX_METADATA {
                        return Err(upload_error("INVALID_FILE_METADATA", "a metadata part is larger than 64 KiB"));
                    }
                }
                let m: UploadMetadata = serde_json::from_slice(&raw).map_err(|e| {
                    upload_error(
                        "INVALID_FILE_METADATA",
                        format!("invalid metadata: {e}: expected {{\"path\": \"/workspace/f\", \"mode\": 644}}"),
                    )
                })?;
                metadata.push_back(m);
            }
            Some("file") => {
                let meta = metadata.pop_front().ok_or_else(|| {
                    upload_error("INVALID_FILE", "a file part came before its metadata part: send metadata, then file")
                })?;
                let path = meta.path.filter(|p| !p.is_empty()).ok_or_else(|| {
                    upload_error("INVALID_FILE_METADATA", "metadata path is empty: give the file's path in the sandbox")
                })?;
                let mode = parse_mode(meta.mode.unwrap_or(0)).map_err(|m| upload_error("INVALID_FILE_METADATA", m))?;
                let owner = wanted_owner(&state, &sandbox, meta.owner.as_deref(), meta.group.as_deref()).await?;
                received +=
                    store_upload(&state, &sandbox, &path, mode, &mut field, limit.saturating_sub(received)).await?;
                apply_owner(&state, &sandbox, &path, owner).await?;
                files += 1;
            }
            // Parts execd does not know are skipped.
            _ => while field.chunk().await.map_err(|e| multipart_error(&e, limit))?.is_some() {},
        }
    }
    if files == 0 {
        return Err(upload_error("INVALID_FILE", "no file part: send a metadata part, then a file part, per file"));
    }
    if !metadata.is_empty() {
        return Err(upload_error(
            "INVALID_FILE",
            format!(
                "{} metadata part(s) had no file part after them: the files before them were stored",
                metadata.len()
            ),
        ));
    }
    Ok(StatusCode::OK)
}

/// Streams one file part into the sandbox at `path`; returns the bytes stored.
async fn store_upload(
    state: &ExecdState,
    sandbox: &SandboxId,
    path: &str,
    mode: Option<u32>,
    field: &mut Field<'_>,
    budget: u64,
) -> ApiResult<u64> {
    let staging = staging_path(path);
    // The multipart field borrows the request; an in-memory pipe hands its bytes to the runtime.
    let (r, mut tx) = tokio::io::duplex(CHUNK);
    let op = state.rt.write_file(sandbox, &staging, mode, Box::new(r));
    let feed = async move {
        let mut n = 0u64;
        loop {
            let chunk = match field.chunk().await {
                Ok(Some(c)) => c,
                Ok(None) => return Ok(n),
                Err(e) => return Err(FeedError::Multipart(multipart_error(&e, state.config.max_upload_bytes))),
            };
            n += chunk.len() as u64;
            if n > budget {
                return Err(FeedError::TooLarge);
            }
            if tx.write_all(&chunk).await.is_err() {
                // The sandbox side stopped reading; its answer says why.
                return Ok(n);
            }
        }
        // Returning drops the writing end: the sandbox side sees the end of the file.
    };
    let (written, fed) = tokio::join!(op, feed);
    let fail = |mut e: ApiError| async {
        let _ = state.rt.file(sandbox, FileOp::Remove { path: staging.clone(), recursive: false }).await;
        // The staging name means nothing to the client: speak of the file it asked for.
        let (staged, asked) = (base_name(&staging), base_name(path));
        e.message = e.message.replace(staged, asked);
        Err(e)
    };
    let n = match (fed, written) {
        (Err(FeedError::TooLarge), _) => {
            return fail(too_large(state.config.max_upload_bytes)).await;
        }
        (Err(FeedError::Multipart(e)), _) => return fail(e).await,
        (Ok(_), Err(e)) => return fail(e.into()).await,
        (Ok(n), Ok(_)) => n,
    };
    if let Err(e) = run_op(state, sandbox, FileOp::Move { from: staging.clone(), to: path.to_owned() }).await {
        return fail(e).await;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(data: &[&[u8]], offset: u64, limit: Option<u64>) -> String {
        let mut w = LineWindow::new(offset, limit);
        let mut out = Vec::new();
        for d in data {
            w.push(d, &mut out);
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn owners_are_named_by_the_sandboxs_names_or_ids_and_root_is_refused() {
        let db = Names::parse_db(
            "root:x:0:0::/root:/bin/sh\nwww-data:x:33:33::/:/bin/false\nuser:x:1000:1000::/w:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n",
        );
        let owner = |given: &str| file_owner(given, 1000, &db, "user", "/etc/passwd");
        assert_eq!(owner("www-data"), Ok(FileOwner::Id(33)));
        assert_eq!(owner("33"), Ok(FileOwner::Id(33)));
        assert_eq!(owner("4242"), Ok(FileOwner::Id(4242)));
        assert_eq!(owner("user"), Ok(FileOwner::SandboxUser));
        assert_eq!(owner("1000"), Ok(FileOwner::SandboxUser));
        assert_eq!(owner("nobody"), Ok(FileOwner::Nobody));
        assert_eq!(owner("65534"), Ok(FileOwner::Nobody));
        // An image without nobody in its passwd still has the id.
        assert_eq!(file_owner("nogroup", 1000, &HashMap::new(), "group", "/etc/group"), Ok(FileOwner::Nobody));
        for root in ["root", "0"] {
            let e = owner(root).unwrap_err();
            assert_eq!((e.status, e.code), (StatusCode::BAD_REQUEST, "NOT_SUPPORTED"), "{e:?}");
            assert!(e.message.contains("root"), "{e:?}");
        }
        let e = file_owner("root", 1000, &HashMap::new(), "user", "/etc/passwd").unwrap_err();
        assert_eq!(e.code, "NOT_SUPPORTED", "{e:?}");
        let e = owner("65535").unwrap_err();
        assert!(e.message.contains("only ids 1 to 65534"), "{e:?}");
        let e = owner("postgres").unwrap_err();
        assert_eq!((e.status, e.code), (StatusCode::BAD_REQUEST, "INVALID_ARGUMENT"), "{e:?}");
        assert!(e.message.contains("\"postgres\"") && e.message.contains("/etc/passwd"), "{e:?}");
    }

    #[test]
    fn line_mode_matches_execd() {
        let text: &[&[u8]] = &[b"one\r\ntw", b"o\nthree\r", b"\nfour"];
        assert_eq!(window(text, 1, None), "one\ntwo\nthree\nfour");
        assert_eq!(window(text, 2, Some(2)), "two\nthree");
        assert_eq!(window(text, 4, None), "four");
        assert_eq!(window(text, 9, None), "");
        assert_eq!(window(&[b"a\n\nb\n"], 1, None), "a\n\nb");
        assert_eq!(window(&[b"a\rb\n"], 1, None), "a\rb");
        assert_eq!(window(&[b"x\r"], 1, None), "x");
    }

    #[test]
    fn staging_names_sit_next_to_the_target() {
        let s = staging_path("/workspace/dir/f.txt");
        assert!(s.starts_with("/workspace/dir/.f.txt.paddock-upload-"), "{s}");
        assert!(staging_path("f").starts_with(".f.paddock-upload-"));
        assert_ne!(staging_path("f"), staging_path("f"));
    }

    #[test]
    fn file_info_has_the_sdk_shape() {
        let names = Names { users: HashMap::from([(1000, "alice".into())]), groups: HashMap::new() };
        let s = FileStat {
            path: "/workspace/a".into(),
            kind: FileKind::Dir,
            size: 4096,
            mode: 0o755,
            uid: 1000,
            gid: 1000,
            modified_unix_ms: 1_700_000_000_000,
        };
        let v = serde_json::to_value(file_info(s, &names)).unwrap();
        assert_eq!(v["type"], "directory");
        assert_eq!(v["mode"], 755);
        assert_eq!(v["owner"], "alice");
        assert_eq!(v["group"], "1000");
        assert_eq!(v["modified_at"], "2023-11-14T22:13:20Z");
        assert_eq!(v["created_at"], v["modified_at"]);
        assert_eq!(v["path"], "/workspace/a");
    }

    #[test]
    fn dispositions_encode_odd_names() {
        assert_eq!(content_disposition("/w/a b.txt"), "attachment; filename=\"a b.txt\"");
        assert_eq!(content_disposition("/w/é"), "attachment; filename=\"%C3%A9\"; filename*=UTF-8''%C3%A9");
        assert_eq!(content_disposition("/w/q\"x"), "attachment; filename=\"q%22x\"; filename*=UTF-8''q%22x");
    }
}
