// How each event of a task's log looks in the console. Every piece of text goes into the page
// as text (textContent), never as markup.
"use strict";

// A command's output is shown up to this many lines; the rest behind "show all".
const SHOWN_LINES = 200;

export function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function stateBadge(state) {
  return h("span", { class: "badge state-" + state, text: state, dataset: { state } });
}

export function age(iso) {
  if (!iso) return "";
  const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (seconds < 60) return Math.floor(seconds) + "s ago";
  if (seconds < 3600) return Math.floor(seconds / 60) + "m ago";
  if (seconds < 86400) return Math.floor(seconds / 3600) + "h ago";
  return Math.floor(seconds / 86400) + "d ago";
}

export function money(usd) {
  if (usd === null || usd === undefined) return "—";
  if (usd === 0) return "$0";
  if (usd < 0.01) return "$" + usd.toFixed(4);
  return "$" + usd.toFixed(2);
}

function clock(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return isNaN(d) ? "" : d.toLocaleTimeString();
}

// Terminal-style output, bounded: the first SHOWN_LINES lines, then a button for the rest.
export function terminal(text, { prompt = null, exitCode = null, extra = null } = {}) {
  const pre = h("pre", { class: "term" });
  if (prompt !== null) pre.append(h("span", { class: "prompt", text: "$ " }), prompt + "\n");
  const lines = (text || "").replace(/\n$/, "").split("\n");
  const body = document.createTextNode("");
  pre.append(body);
  const wrap = h("div", {}, pre);
  const show = (all) => {
    body.textContent = (all ? lines : lines.slice(0, SHOWN_LINES)).join("\n");
  };
  show(false);
  if (exitCode !== null && exitCode !== 0) {
    pre.append(h("span", { class: "exit-bad", text: `\n[exit code ${exitCode}]` }));
  }
  if (lines.length > SHOWN_LINES) {
    const note = h("div", { class: "cut" },
      `${lines.length - SHOWN_LINES} more lines `,
      h("button", { type: "button", text: "show all", onclick: (e) => { show(true); e.target.parentNode.remove(); } }));
    wrap.append(note);
  }
  if (extra) wrap.append(extra);
  return wrap;
}

// A unified diff, each line coloured by its kind.
export function diff(text) {
  const pre = h("pre", { class: "diff" });
  for (const line of (text || "").replace(/\n$/, "").split("\n")) {
    let cls = "";
    if (line.startsWith("+++") || line.startsWith("---")) cls = "meta";
    else if (line.startsWith("@@")) cls = "hunk";
    else if (line.startsWith("+")) cls = "add";
    else if (line.startsWith("-")) cls = "del";
    pre.append(h("span", { class: cls, text: line || " " }));
  }
  return pre;
}

// A new file's content as a diff from nothing.
function creationDiff(path, content) {
  const lines = (content || "").replace(/\n$/, "").split("\n");
  const shown = lines.slice(0, SHOWN_LINES);
  const text = [`--- /dev/null`, `+++ ${path}`, `@@ -0,0 +1,${lines.length} @@`]
    .concat(shown.map((l) => "+" + l)).join("\n");
  const node = h("div", {}, diff(text));
  if (lines.length > SHOWN_LINES) {
    node.append(h("div", { class: "cut", text: `${lines.length - SHOWN_LINES} more lines not shown` }));
  }
  return node;
}

function codeBlock(text) {
  return h("pre", { class: "code", text: text || "" });
}

function textBlock(text) {
  return h("div", { class: "text", text: text || "" });
}

function usageNote(event) {
  const u = event.llm_usage;
  if (!u) return null;
  const tokens = (u.prompt_tokens || 0) + (u.completion_tokens || 0);
  return `${tokens} tokens, ${money(u.cost_usd)}`;
}

// What each kind looks like: [css class, title, body builder]. `ctx` has the task id and a
// function to fetch a blob with the key (`openBlob`).
// The agent's plan (task_tracker): one line per task, its status as a box.
export function planList(tasks) {
  const marks = { todo: "☐", in_progress: "◐", done: "☑" };
  return h("ol", { class: "plan" }, ...tasks.map((t) =>
    h("li", { class: "plan-" + (t.status || "todo"),
      text: `${marks[t.status || "todo"]} ${t.title}${t.notes ? ` — ${t.notes}` : ""}` })));
}

const KINDS = {
  message: (e) => e.source === "USER"
    ? ["user", "you", textBlock(e.content)]
    : ["agent-message", e.wait_for_response ? "agent asks" : "agent says", textBlock(e.content)],
  run: (e) => ["action", e.is_input ? "input to the running command" : "runs a command",
    h("pre", { class: "term" }, h("span", { class: "prompt", text: "$ " }), e.command)],
  run_output: (e, ctx) => ["output", `output (exit ${e.exit_code}${e.timed_out ? ", timed out" : ""}, ${e.cwd})`,
    terminal(e.content, { exitCode: e.exit_code, extra: blobLink(e, ctx) })],
  run_python: (e) => ["action", "runs Python", codeBlock(e.code)],
  python_output: (e, ctx) => ["output", "Python output",
    terminal(e.content, { exitCode: e.exit_code, extra: blobLink(e, ctx) })],
  read: (e) => ["action quiet-ish", "reads a file", h("code", { text: e.path })],
  read_output: (e, ctx) => ["output", "file " + e.path, terminal(e.content, { extra: blobLink(e, ctx) })],
  write: (e) => ["action", "writes " + e.path,
    e.content_ref ? textBlock(`(${e.content_ref.size} bytes, kept in the blob store)`) : creationDiff(e.path, e.content)],
  write_output: (e) => ["quiet", "wrote " + e.path, null],
  // The edit's outcome (edit_output) carries the real diff; the action shows only a new file.
  edit: (e) => ["action", `edits ${e.path} (${e.command})`, e.command === "create" ? editBody(e) : null],
  edit_output: (e) => ["output", "edited " + e.path, e.diff ? diff(e.diff) : terminal(e.content)],
  mcp_call: (e) => ["action", `calls ${e.tool} (MCP server ${e.server})`,
    codeBlock(JSON.stringify(e.arguments || {}, null, 2))],
  mcp_output: (e) => [e.is_error ? "output err" : "output", `${e.tool} answered${e.is_error ? " an error" : ""}`,
    terminal(e.content)],
  glob: (e) => ["action quiet-ish", "finds files", h("code", { text: e.pattern + (e.path ? ` in ${e.path}` : "") })],
  grep: (e) => ["action quiet-ish", "searches files", h("code", {
    text: e.pattern + (e.include ? ` in ${e.include}` : "") + (e.path ? ` under ${e.path}` : "") })],
  apply_patch: (e) => ["action", "applies a patch", diff(e.patch)],
  task_tracker: (e) => ["action quiet-ish", e.command === "view" ? "looks at its plan" : "plans",
    e.command === "view" ? null : planList(e.tasks || [])],
  think: (e) => ["quiet", "thinks", null],
  finish: (e) => ["finish", "finished", textBlock(e.final_message)],
  error: (e) => ["err", "error: " + e.error_code, textBlock(e.content)],
  agent_state_changed: (e) => ["quiet state", null,
    h("span", {}, e.previous_state ? stateBadge(e.previous_state) : "", " → ", stateBadge(e.agent_state),
      e.reason ? " " + e.reason : "")],
  change_agent_state: (e) => ["quiet", `asks for ${e.agent_state}`, e.reason ? textBlock(e.reason) : null],
  security_verdict: (e) => ["quiet", null,
    h("span", {}, "security: ", h("span", { class: "verdict-" + e.verdict, text: e.verdict }),
      ` risk ${e.risk}`, e.rule ? ` (${e.rule})` : "", e.reason ? ": " + e.reason : "")],
  user_rejected: (e) => ["err", "rejected", textBlock(e.content)],
  delegate: (e, ctx) => ["delegate", "delegates a sub-task", h("div", {},
    textBlock(e.task), e.max_iterations ? h("div", { class: "muted", text: `at most ${e.max_iterations} iterations` }) : null)],
  delegate_output: (e) => ["delegate", "sub-task ended", h("div", {},
    h("div", {}, "sub-task ", h("a", { href: "#/tasks/" + e.sub_task_id, text: e.sub_task_id }), " ", stateBadge(e.agent_state)),
    e.content ? textBlock(e.content) : null)],
  condensation: (e) => ["quiet", `history condensed (events up to #${e.forgotten_up_to_seq} summarised)`, null],
  sandbox_queued: (e) => ["quiet", `waiting for a sandbox: place ${e.position} (${e.max_sandboxes} seats)`, null],
  egress_activity: (e) => ["quiet", "network: " + e.connections.map((c) => `${c.host}:${c.port} ` +
    (c.allowed ? `${c.bytes_out} B out, ${c.bytes_in} B in` : `refused (${c.reason})`) +
    ((c.secrets || []).length ? ` (added ${c.secrets.join(", ")})` : "")).join("; ") +
    (e.more ? `, and ${e.more} more` : ""), null],
  workspace_checkpoint: (e) => e.skipped
    ? ["quiet", `no checkpoint of #${e.action_seq}: ${e.detail || e.skipped}`, null]
    : ["quiet", `checkpoint of #${e.action_seq}: ${e.files} paths, ${e.changed} changed, ` +
      `${e.stored_bytes} B stored`, null],
  loop_hint: (e) => ["err", `loop hint ${e.hints_given}: ${e.hint}`, null],
  workspace_uploaded: (e) => ["user", `uploaded ${e.files} file(s) into /workspace` +
    (e.path ? `/${e.path}` : "") + ` (${e.format})`, null],
  task_created: (e) => ["quiet", `task created: at most ${e.max_iterations} iterations` +
    (e.max_budget_usd ? `, budget ${money(e.max_budget_usd)}` : "") +
    (e.confirmation_mode ? `, confirmation from ${e.confirmation_threshold} risk` : "") +
    (e.forked_from ? `; a fork of ${e.forked_from.slice(0, 8)} at #${e.forked_at}` : ""), null],
  rewind: (e) => e.rewound_to == null
    ? ["quiet", `rewind to #${e.to} asked`, null]
    : ["user", `rewound to #${e.rewound_to} (what came after is out of its course)`, null],
};

function editBody(e) {
  if (e.command === "create") return creationDiff(e.path, e.file_text);
  if (e.command === "str_replace") {
    const text = [`--- ${e.path}`, `+++ ${e.path}`]
      .concat((e.old_str || "").split("\n").map((l) => "-" + l))
      .concat((e.new_str || "").split("\n").map((l) => "+" + l)).join("\n");
    return diff(text);
  }
  if (e.command === "insert") return diff((e.new_str || "").split("\n").map((l) => "+" + l).join("\n"));
  return null;
}

function blobLink(e, ctx) {
  if (!e.content_ref || !ctx || !ctx.openBlob) return null;
  return h("div", { class: "cut" }, `cut for display; the whole output is ${e.content_ref.size} bytes `,
    h("button", { type: "button", text: "download it", onclick: () => ctx.openBlob(e.content_ref.sha256) }));
}

// One list item for one event; data-seq and data-kind let tests (and people) find it.
export function renderEvent(e, ctx) {
  const build = KINDS[e.kind];
  let cls, title, body;
  if (build) {
    [cls, title, body] = build(e, ctx);
  } else {
    [cls, title, body] = ["quiet", e.kind, codeBlock(JSON.stringify(e, null, 2))];
  }
  const quiet = cls.split(" ").includes("quiet");
  const head = h("div", { class: "ev-head" },
    h("span", { class: "seq", text: "#" + e.seq }),
    // A fork's copy of its parent's entry (issue 28): marked, so the fork's own steps stand out.
    e.inherited_from ? h("span", { class: "inherited", title: "from task " + e.inherited_from, text: "inherited" }) : null,
    title ? h("span", { class: "what", text: title }) : null,
    quiet && body ? body : null,
    usageNote(e) ? h("span", { class: "muted", text: usageNote(e) }) : null,
    h("span", { class: "time", text: clock(e.timestamp) }),
    ctx.onFork ? h("button", { type: "button", class: "fork-here", title: "New tasks from this task's log and files at #" + e.seq, text: "Fork from here", onclick: () => ctx.onFork(e.seq) }) : null,
    ctx.onRewind ? h("button", { type: "button", class: "rewind-here", title: "Take this (paused or ended) task back to #" + e.seq + ", its files included", text: "Rewind to here", onclick: (ev) => ctx.onRewind(e.seq, ev.currentTarget) }) : null);
  const li = h("li", { class: cls, dataset: { seq: String(e.seq), kind: e.kind, source: e.source || "" } }, head);
  if (e.thought && e.source === "AGENT" && e.kind !== "message") {
    li.append(h("div", { class: "thought", text: e.thought }));
  }
  if (!quiet && body) li.append(body);
  return li;
}
