// Paddock's JavaScript code-interpreter driver: one `node -e` process per context, the user's
// code in a vm context of its own. Requests are JSON lines on stdin ({"code": ...}); replies are
// marker lines, MARK + JSON, written through the same streams as the user's console output so
// they arrive after it; a done marker on stderr tells the server that stderr is drained too.
'use strict';
const vm = require('vm');
const util = require('util');
const { Console } = require('console');
const MARK = '\x1ePADDOCK-' + (process.env.PADDOCK_CODE_NONCE || '') + ' ';
delete process.env.PADDOCK_CODE_NONCE;
const typescript = process.env.PADDOCK_CODE_LANG === 'typescript';
delete process.env.PADDOCK_CODE_LANG;

// TypeScript cells become JavaScript first: with Node's own type stripping (22.13 and later),
// else with the typescript package wherever this Node finds it (its global modules included).
// Neither: the driver says what is missing and exits before it is ready.
function typescriptToJs() {
  const mod = require('module');
  if (typeof mod.stripTypeScriptTypes === 'function') {
    return (code) => mod.stripTypeScriptTypes(code, { mode: 'transform' });
  }
  const path = require('path');
  const places = [
    ...(process.env.NODE_PATH || '').split(':').filter(Boolean),
    path.join(path.dirname(process.execPath), '..', 'lib', 'node_modules'),
    '/usr/local/lib/node_modules', '/usr/lib/node_modules',
  ];
  for (const where of [undefined, ...places]) {
    try {
      const ts = require(where ? require.resolve('typescript', { paths: [where] }) : 'typescript');
      const options = { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.CommonJS, esModuleInterop: true };
      return (code) => ts.transpile(code, options);
    } catch (e) { /* next place */ }
  }
  process.stderr.write('TypeScript contexts need Node.js 22.13 or later (this image has ' + process.version
    + ') or the typescript package (npm install -g typescript) in the image\n');
  process.exit(3);
}
const toJs = typescript ? typescriptToJs() : (code) => code;
const reply = (obj, stream) => (stream || process.stdout).write(MARK + JSON.stringify(obj) + '\n');
const sandbox = {
  console: new Console({ stdout: process.stdout, stderr: process.stderr }),
  require, process, Buffer, URL, URLSearchParams, TextEncoder, TextDecoder, AbortController,
  setTimeout, clearTimeout, setInterval, clearInterval, setImmediate, clearImmediate,
  queueMicrotask, structuredClone, fetch: globalThis.fetch, module: { exports: {} },
};
sandbox.global = sandbox;
sandbox.globalThis = sandbox;
const context = vm.createContext(sandbox);
let cells = 0;
// Idle, an interrupt must not end the context; while a script runs, breakOnSigint turns it
// into an exception.
process.on('SIGINT', () => {});
// An error thrown later by a callback of an earlier cell must not end the context either.
process.on('uncaughtException', (e) => process.stderr.write(String((e && e.stack) || e) + '\n'));
process.on('unhandledRejection', (e) => process.stderr.write('Unhandled rejection: ' + String((e && e.stack) || e) + '\n'));

function errorReply(e) {
  if (e instanceof Error || (e && typeof e === 'object' && 'stack' in e)) {
    const stack = String(e.stack || (e.name + ': ' + e.message));
    return { t: 'error', ename: String(e.name || 'Error'), evalue: String(e.message || ''), traceback: stack.split('\n') };
  }
  return { t: 'error', ename: 'Error', evalue: util.inspect(e), traceback: [] };
}

async function run(code) {
  cells += 1;
  let value;
  try {
    const script = new vm.Script(toJs(code), { filename: '<cell-' + cells + '>' });
    value = script.runInContext(context, { breakOnSigint: true });
    if (value && typeof value.then === 'function') value = await value;
    if (value !== undefined) return { t: 'result', data: { 'text/plain': util.inspect(value) } };
    return null;
  } catch (e) {
    return errorReply(e);
  }
}

let pending = '';
let busy = false;
const queue = [];
async function pump() {
  if (busy) return;
  busy = true;
  while (queue.length) {
    const line = queue.shift();
    let r;
    try {
      r = await run(JSON.parse(line).code);
    } catch (e) {
      r = errorReply(e);
    }
    if (r) reply(r);
    reply({ t: 'done' });
    reply({ t: 'done' }, process.stderr);
  }
  busy = false;
}
process.stdin.setEncoding('utf8');
process.stdin.on('data', (chunk) => {
  pending += chunk;
  let i;
  while ((i = pending.indexOf('\n')) >= 0) {
    queue.push(pending.slice(0, i));
    pending = pending.slice(i + 1);
  }
  pump();
});
process.stdin.on('end', () => process.exit(0));
reply({ t: 'ready' });
reply({ t: 'ready' }, process.stderr);
