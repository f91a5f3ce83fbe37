// The deckhands web console: sign in with an API key, list tasks, post one, follow it live.
// No framework and no build step: the browser runs these files as they are.
"use strict";

import { EventFollower } from "./stream.js";
import { age, diff, h, money, planList, renderEvent, stateBadge } from "./render.js";

const KEY_STORAGE = "deckhands.apiKey";
const ENDED = new Set(["FINISHED", "ERROR", "STOPPED", "REJECTED"]);
const STATES = ["LOADING", "RUNNING", "AWAITING_USER_INPUT", "AWAITING_USER_CONFIRMATION",
  "USER_CONFIRMED", "USER_REJECTED", "PAUSED", "RATE_LIMITED", "FINISHED", "ERROR", "STOPPED",
  "REJECTED"];
const ACTIVE = STATES.filter((s) => !ENDED.has(s));

const $ = (id) => document.getElementById(id);

// ---- the key and the API -------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, message, body) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

function apiKey() {
  return sessionStorage.getItem(KEY_STORAGE);
}

function describeError(status, body) {
  if (body && Array.isArray(body.detail)) {
    return body.detail.map((d) => {
      const where = (d.loc || []).filter((p) => p !== "body").join(".");
      return (where ? where + ": " : "") + d.msg;
    }).join("\n");
  }
  if (body && typeof body.detail === "string") return body.detail;
  return "HTTP " + status;
}

async function api(method, path, { body, idempotencyKey, raw } = {}) {
  const key = apiKey();
  if (!key) {
    signOut("Sign in first.");
    throw new ApiError(401, "not signed in");
  }
  const headers = { Authorization: "Bearer " + key };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (idempotencyKey) headers["Idempotency-Key"] = idempotencyKey;
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
      credentials: "omit",
    });
  } catch (err) {
    throw new ApiError(0, "the gateway did not answer (" + err.message + ")");
  }
  if (response.status === 401) {
    signOut("The gateway refused the API key (unknown or revoked).");
    throw new ApiError(401, "API key refused");
  }
  if (raw && response.ok) return response;
  const text = await response.text();
  let parsed = null;
  try {
    parsed = text ? JSON.parse(text) : null;
  } catch (err) {
    parsed = null;
  }
  if (!response.ok) throw new ApiError(response.status, describeError(response.status, parsed), parsed);
  return parsed;
}

function newIdempotencyKey() {
  // crypto.randomUUID exists only in secure contexts (https, localhost); this works anywhere.
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return "console-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

// A download of what a request answers (the key travels in a header, so a plain link cannot).
async function download(path, filename) {
  const response = await api("GET", path, { raw: true });
  const blob = await response.blob();
  const url = URL.createObjectURL(blob);
  const link = h("a", { href: url, download: filename });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

// ---- signing in ----------------------------------------------------------------------------

function signOut(message) {
  sessionStorage.removeItem(KEY_STORAGE);
  showSignIn(message);
}

function showSignIn(message) {
  teardown();
  $("view").replaceChildren();
  $("nav").hidden = true;
  $("who").hidden = true;
  $("sign-out").hidden = true;
  $("sign-in").hidden = false;
  const error = $("sign-in-error");
  error.textContent = message || "";
  error.hidden = !message;
  $("api-key").focus();
}

async function signIn(event) {
  event.preventDefault();
  const key = $("api-key").value.trim();
  if (!key) return;
  sessionStorage.setItem(KEY_STORAGE, key);
  try {
    await whoAmI();
  } catch (err) {
    if (err.status !== 401) showSignIn(err.message);
    return;
  }
  $("api-key").value = "";
  route();
}

async function whoAmI() {
  const quotas = await api("GET", "/v1/quotas");
  $("who").textContent = "tenant " + quotas.tenant_id;
  $("who").dataset.tenant = quotas.tenant_id;
  $("who").hidden = false;
  $("sign-out").hidden = false;
  $("nav").hidden = false;
  $("sign-in").hidden = true;
  return quotas;
}

// ---- views ---------------------------------------------------------------------------------

// What the current view started (streams, timers); ended when another view opens.
let cleanups = [];
function teardown() {
  for (const fn of cleanups) fn();
  cleanups = [];
}
function every(ms, fn) {
  const timer = setInterval(fn, ms);
  cleanups.push(() => clearInterval(timer));
}

function route() {
  teardown();
  if (!apiKey()) {
    showSignIn();
    return;
  }
  $("sign-in").hidden = true;
  $("nav").hidden = false;
  $("sign-out").hidden = false;
  const hash = location.hash || "#/tasks";
  const match = hash.match(/^#\/tasks\/([^/?]+)$/);
  for (const link of document.querySelectorAll("#nav a")) link.classList.remove("active");
  if (match) {
    taskPage(decodeURIComponent(match[1]));
  } else if (hash === "#/new") {
    $("nav-new").classList.add("active");
    newTaskPage();
  } else {
    $("nav-tasks").classList.add("active");
    taskListPage();
  }
}

function errorBox(err) {
  return h("p", { class: "error", role: "alert", text: err.message || String(err) });
}

// ---- the task list -------------------------------------------------------------------------

function taskListPage() {
  document.title = "Tasks · deckhands";
  const stateSelect = h("select", { id: "filter-state" },
    h("option", { value: "", text: "any state" }),
    h("option", { value: "active", text: "not ended" }),
    h("option", { value: "ended", text: "ended" }),
    STATES.map((s) => h("option", { value: s, text: s })));
  const labelInput = h("input", { id: "filter-label", type: "text", placeholder: "team=payments ticket:ABC-12" });
  const textInput = h("input", { id: "filter-text", type: "text", placeholder: "words in the task or its id" });
  const tbody = h("tbody", { id: "task-rows" });
  const more = h("button", { type: "button", id: "more", text: "More", hidden: true });
  const status = h("div", { class: "muted", id: "list-status" });
  let cursor = null;
  let shown = [];
  let pages = 0;

  const query = (after) => {
    const params = new URLSearchParams({ limit: "50" });
    const chosen = stateSelect.value;
    const states = chosen === "active" ? ACTIVE : chosen === "ended" ? [...ENDED] : chosen ? [chosen] : [];
    for (const s of states) params.append("state", s);
    for (const label of labelInput.value.split(/[\s,]+/).filter(Boolean)) params.append("label", label);
    if (after) params.set("cursor", after);
    return "/v1/tasks?" + params;
  };

  const draw = () => {
    const words = textInput.value.trim().toLowerCase();
    const rows = shown.filter((t) => !words || (t.task + " " + t.id).toLowerCase().includes(words));
    tbody.replaceChildren(...rows.map((t) => h("tr", { dataset: { id: t.id, state: t.state } },
      h("td", {}, stateBadge(t.state)),
      h("td", { class: "text" }, h("a", { href: "#/tasks/" + encodeURIComponent(t.id), text: t.task, title: t.task })),
      h("td", {}, t.labels.map((l) => h("span", { class: "label", text: l }))),
      h("td", { class: "num", text: String(t.iterations) }),
      h("td", { class: "num", text: money(t.cost_usd) }),
      h("td", { class: "num", title: t.created_at, text: age(t.created_at) }),
      h("td", { class: "mono muted", text: t.id.slice(0, 8) }))));
    if (rows.length === 0) {
      tbody.append(h("tr", {}, h("td", { colspan: "7", class: "empty" },
        shown.length ? "No task matches the words." : "No task matches. ",
        shown.length ? null : h("a", { href: "#/new", text: "Post one." }))));
    }
    more.hidden = !cursor;
  };

  const load = async (append) => {
    try {
      const page = await api("GET", query(append ? cursor : null));
      shown = append ? shown.concat(page.tasks) : page.tasks;
      pages = append ? pages + 1 : 1;
      cursor = page.next_cursor;
      status.textContent = "updated " + new Date().toLocaleTimeString();
      draw();
    } catch (err) {
      if (err.status !== 401) status.replaceChildren(errorBox(err));
    }
  };

  const form = h("form", { class: "filters", onsubmit: (e) => { e.preventDefault(); load(false); } },
    h("div", {}, h("label", { for: "filter-state", text: "State" }), stateSelect),
    h("div", { class: "grow" }, h("label", { for: "filter-label", text: "Labels (all of them)" }), labelInput),
    h("div", { class: "grow" }, h("label", { for: "filter-text", text: "Search this page" }), textInput),
    h("div", { class: "shrink" }, h("button", { type: "submit", class: "primary", text: "Filter" })));
  stateSelect.addEventListener("change", () => load(false));
  textInput.addEventListener("input", draw);
  more.addEventListener("click", () => load(true));

  $("view").replaceChildren(h("section", { class: "card" },
    h("div", { class: "row" }, h("h1", { text: "Tasks" }),
      h("div", { class: "shrink" }, h("a", { href: "#/new" }, h("button", { type: "button", class: "primary", text: "New task" })))),
    form,
    h("table", { class: "tasks" },
      h("thead", {}, h("tr", {}, ["State", "Task", "Labels", "Iterations", "Cost", "Created", "Id"]
        .map((name) => h("th", { text: name })))),
      tbody),
    h("div", { class: "row" }, h("div", {}, status), h("div", { class: "shrink" }, more))));
  load(false);
  // Keeps the first page fresh while the list is shown (states, iterations and cost move).
  // (Not once the user paged on: that would take the later pages away.)
  every(5000, () => { if (!document.hidden && pages === 1) load(false); });
}

// ---- a new task ----------------------------------------------------------------------------

function newTaskPage() {
  document.title = "New task · deckhands";
  const idempotencyKey = newIdempotencyKey(); // one form, one task, however often it is sent
  const error = h("p", { class: "error", role: "alert", id: "new-task-error", hidden: true });
  const threshold = h("select", { id: "confirmation-threshold", name: "confirmation_threshold" },
    h("option", { value: "", text: "server default" }),
    ["LOW", "MEDIUM", "HIGH", "UNKNOWN"].map((r) => h("option", { value: r, text: r })));
  const form = h("form", { id: "new-task-form", autocomplete: "off" },
    h("label", { for: "new-task-text", text: "What should the agent do?" }),
    h("textarea", { id: "new-task-text", name: "task", required: true, rows: "6",
      placeholder: "Write a Python script that prints the squares of 1 to 10 and run it" }),
    h("div", { class: "row" },
      h("div", {}, h("label", { for: "max-iterations", text: "Max iterations" }),
        h("input", { id: "max-iterations", type: "number", min: "1", max: "1000", placeholder: "server default" })),
      h("div", {}, h("label", { for: "max-budget", text: "Budget (USD)" }),
        h("input", { id: "max-budget", type: "number", min: "0", step: "0.01", placeholder: "server default" })),
      h("div", {}, h("label", { for: "labels", text: "Labels" }),
        h("input", { id: "labels", type: "text", placeholder: "team=payments ticket:ABC-12" }))),
    h("div", { class: "row" },
      h("div", { class: "grow" }, h("label", { for: "repo-url", text: "Repository (checked out into /workspace)" }),
        h("input", { id: "repo-url", type: "text", placeholder: "https://git.example.com/team/project.git" })),
      h("div", {}, h("label", { for: "repo-ref", text: "Branch, tag or commit" }),
        h("input", { id: "repo-ref", type: "text", placeholder: "default branch" })),
      h("div", {}, h("label", { for: "repo-token", text: "Token secret" }),
        h("input", { id: "repo-token", type: "text", placeholder: "name of a secret" }))),
    h("div", { class: "row" },
      h("div", {}, h("label", { for: "secrets", text: "Secrets the commands get (names)" }),
        h("input", { id: "secrets", type: "text", placeholder: "API_TOKEN DB_PASSWORD" }))),
    h("div", { class: "row" },
      h("div", {}, h("label", { class: "inline" },
        h("input", { id: "confirmation-mode", type: "checkbox" }), "Ask me before risky actions (confirmation mode)")),
      h("div", {}, h("label", { for: "confirmation-threshold", text: "…from this risk up" }), threshold),
      h("div", {}, h("label", { class: "inline" },
        h("input", { id: "network-egress", type: "checkbox" }), "Network access for the sandbox"))),
    h("button", { type: "submit", class: "primary", id: "post-task", text: "Start the task" }),
    error);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = { task: $("new-task-text").value };
    const iterations = $("max-iterations").value;
    if (iterations) body.max_iterations = Number(iterations);
    const budget = $("max-budget").value;
    if (budget) body.max_budget_usd = Number(budget);
    if ($("confirmation-mode").checked) body.confirmation_mode = true;
    if (threshold.value) body.confirmation_threshold = threshold.value;
    if ($("network-egress").checked) body.network_egress = true;
    const labels = $("labels").value.split(/[\s,]+/).filter(Boolean);
    if (labels.length) body.labels = labels;
    const secrets = $("secrets").value.split(/[\s,]+/).filter(Boolean);
    if (secrets.length) body.secrets = secrets;
    const repo = $("repo-url").value.trim();
    if (repo) {
      body.repository = { url: repo };
      if ($("repo-ref").value.trim()) body.repository.ref = $("repo-ref").value.trim();
      if ($("repo-token").value.trim()) body.repository.token_secret = $("repo-token").value.trim();
    }
    $("post-task").disabled = true;
    try {
      const created = await api("POST", "/v1/tasks", { body, idempotencyKey });
      location.hash = "#/tasks/" + encodeURIComponent(created.id);
    } catch (err) {
      error.textContent = err.message;
      error.hidden = false;
      $("post-task").disabled = false;
    }
  });
  $("view").replaceChildren(h("section", { class: "card" }, h("h1", { text: "New task" }), form));
  $("new-task-text").focus();
}

// ---- one task, live ------------------------------------------------------------------------

function taskPage(taskId) {
  document.title = "Task " + taskId.slice(0, 8) + " · deckhands";
  const path = "/v1/tasks/" + encodeURIComponent(taskId);
  const events = h("ol", { class: "events", id: "events" });
  const seen = new Set();
  const streamStatus = h("span", { class: "stream-status", id: "stream-status" });
  const stat = (id, k) => h("div", { class: "stat" }, h("span", { class: "k", text: k }), h("span", { class: "v", id }));
  const head = h("section", { class: "card task-head" },
    h("div", { class: "title", id: "task-text" }),
    h("div", { class: "muted mono", id: "task-id", text: taskId }),
    h("div", { class: "muted", id: "task-lineage", hidden: true }),
    h("div", { class: "stats" },
      h("div", { class: "stat" }, h("span", { class: "k", text: "state" }), h("span", { class: "v", id: "task-state" })),
      stat("task-iterations", "iterations"),
      stat("task-tokens", "tokens"),
      stat("task-cost", "cost"),
      stat("task-age", "created"),
      stat("task-queue", "sandbox queue"),
      h("div", { class: "stat" }, h("span", { class: "k", text: "labels" }), h("span", { class: "v", id: "task-labels" }))),
    h("div", { class: "controls" },
      h("button", { type: "button", id: "pause", text: "Pause" }),
      h("button", { type: "button", id: "resume", text: "Resume" }),
      h("button", { type: "button", id: "stop", class: "danger", text: "Stop" }),
      h("button", { type: "button", id: "show-changes", text: "Changes" }),
      h("button", { type: "button", id: "download-workspace", text: "Download workspace" }),
      h("button", { type: "button", id: "download-trajectory", text: "Download trajectory" }),
      h("button", { type: "button", id: "delete-task", class: "danger", text: "Delete" }),
      h("span", { class: "spacer" }),
      streamStatus),
    h("p", { class: "error", role: "alert", id: "task-error", hidden: true }));
  const confirmPanel = h("section", { class: "card attention", id: "confirm-panel", hidden: true },
    h("h2", { text: "The agent waits for your approval" }),
    h("div", { id: "pending-action" }),
    h("div", { class: "actions-row" },
      h("button", { type: "button", id: "approve", class: "ok", text: "Approve" }),
      h("button", { type: "button", id: "reject", class: "danger", text: "Reject" })));
  const askPanel = h("section", { class: "card", id: "message-panel", hidden: true },
    h("h2", { id: "message-title", text: "Message the agent" }),
    h("div", { id: "agent-question", class: "text" }),
    h("form", { id: "message-form" },
      h("textarea", { id: "message-text", rows: "2", required: true }),
      h("button", { type: "submit", class: "primary", id: "send-message", text: "Send" })));
  const resultPanel = h("section", { class: "card result", id: "result-panel", hidden: true },
    h("h2", { text: "Result" }), h("pre", { id: "result-text" }));
  const subTasks = h("section", { class: "card", id: "sub-tasks", hidden: true });
  const changesPanel = h("section", { class: "card", id: "changes-panel", hidden: true });
  // Issue 28: "Fork from here" on an event opens this form; the task's forks are listed below.
  const forkPanel = h("section", { class: "card attention", id: "fork-panel", hidden: true },
    h("h2", { id: "fork-title", text: "Fork" }),
    h("p", { class: "muted", text: "New tasks, each with this task's log and files at that point; with a message, it is their next one, else the agent goes on." }),
    h("form", { id: "fork-form" },
      h("label", {}, "How many ", h("input", { type: "number", id: "fork-count", min: "1", max: "32", value: "1", required: true })),
      h("textarea", { id: "fork-message", rows: "2", placeholder: "Their next message (optional)" }),
      h("div", { class: "actions-row" },
        h("button", { type: "submit", class: "primary", id: "fork-submit", text: "Fork" }),
        h("button", { type: "button", id: "fork-cancel", text: "Cancel" }))));
  const forksPanel = h("section", { class: "card", id: "forks-panel", hidden: true });
  // The agent's plan (its last task_tracker call), kept current with the task.
  const planPanel = h("section", { class: "card", id: "plan-panel", hidden: true },
    h("h2", { text: "Plan" }), h("div", { id: "plan-body" }));
  const eventsSection = h("section", {}, h("h2", { text: "Events" }), events);
  $("view").replaceChildren(head, confirmPanel, askPanel, resultPanel, planPanel, forkPanel, changesPanel, subTasks, forksPanel, eventsSection);

  let view = null;
  let lastQuestion = "";
  const showError = (err) => {
    const box = $("task-error");
    if (!box) return;
    box.textContent = err ? err.message : "";
    box.hidden = !err;
  };

  let onPaint = () => {};
  const paint = (task) => {
    view = task;
    $("task-text").textContent = task.task;
    $("plan-panel").hidden = !(task.plan || []).length;
    $("plan-body").replaceChildren(planList(task.plan || []));
    $("task-lineage").hidden = !task.forked_from;
    if (task.forked_from && !$("task-lineage").dataset.parent) {
      $("task-lineage").dataset.parent = task.forked_from;
      $("task-lineage").replaceChildren("a fork of ",
        h("a", { id: "fork-parent", href: "#/tasks/" + encodeURIComponent(task.forked_from), text: task.forked_from.slice(0, 8) }),
        ` at #${task.forked_at}`);
    }
    $("task-state").replaceChildren(stateBadge(task.state), task.reason ? h("span", { class: "muted", text: " " + task.reason }) : "");
    $("task-state").dataset.state = task.state;
    $("task-iterations").textContent = `${task.iterations} / ${task.max_iterations}`;
    $("task-tokens").textContent = String(task.usage.total_tokens);
    $("task-cost").textContent = money(task.usage.cost_usd) + (task.max_budget_usd ? " / " + money(task.max_budget_usd) : "");
    $("task-age").textContent = age(task.created_at);
    // While every sandbox seat is taken: the task's place in the queue.
    $("task-queue").textContent = task.queue_position
      ? "place " + task.queue_position +
        (task.queue_estimate_s != null ? ", about " + Math.ceil(task.queue_estimate_s) + " s" : "")
      : "";
    $("task-queue").parentNode.hidden = !task.queue_position;
    $("task-age").title = task.created_at;
    $("task-labels").replaceChildren(...(task.labels.length ? task.labels.map((l) => h("span", { class: "label", text: l })) : ["—"]));
    const ended = ENDED.has(task.state);
    // "Rewind to here" shows on a task that may be rewound: paused or ended, not stopped.
    events.classList.toggle("rewindable", task.state === "PAUSED" || (ended && task.state !== "STOPPED"));
    $("pause").disabled = ended || task.state === "PAUSED" || task.state === "LOADING";
    $("resume").disabled = task.state !== "PAUSED";
    // An ERROR task can still be stopped (that frees its sandbox); the others are over.
    $("stop").disabled = ended && task.state !== "ERROR";
    // Confirmation: the action under review is the one to approve.
    const awaitingConfirmation = task.state === "AWAITING_USER_CONFIRMATION" && task.pending_action;
    confirmPanel.hidden = !awaitingConfirmation;
    if (awaitingConfirmation) {
      const action = task.pending_action;
      const key = action.id;
      if ($("pending-action").dataset.actionId !== key) {
        $("pending-action").dataset.actionId = key;
        $("pending-action").replaceChildren(renderEvent(action, {}));
        $("approve").disabled = false;
        $("reject").disabled = false;
      }
    }
    // A message box when the agent asks; also to continue a task that ended (not a stopped one).
    const asks = task.state === "AWAITING_USER_INPUT";
    askPanel.hidden = !(asks || (ended && task.state !== "STOPPED") || task.state === "PAUSED");
    // Where the eye is: above the events when the agent asks, below them otherwise.
    if (asks && askPanel.nextSibling !== resultPanel) confirmPanel.after(askPanel);
    if (!asks && eventsSection.nextSibling !== askPanel) eventsSection.after(askPanel);
    askPanel.classList.toggle("attention", asks);
    $("message-title").textContent = asks ? "The agent asks you" : "Send the agent a message (it continues the task)";
    $("agent-question").textContent = asks ? lastQuestion : "";
    resultPanel.hidden = !task.result;
    if (task.result) $("result-text").textContent = task.result.final_message;
    onPaint(task);
    subTasks.hidden = task.sub_tasks.length === 0;
    if (task.sub_tasks.length) {
      subTasks.replaceChildren(h("h2", { text: "Sub-tasks" }), h("ul", {}, task.sub_tasks.map((s) =>
        h("li", {}, stateBadge(s.state), " ", h("a", { href: "#/tasks/" + encodeURIComponent(s.id), text: s.task }),
          h("span", { class: "muted", text: ` ${s.iterations} iterations, ${money(s.usage.cost_usd)}` })))));
    }
  };

  let refreshing = null;
  let again = false;
  const refresh = async () => {
    if (refreshing) {
      again = true;
      return;
    }
    refreshing = (async () => {
      try {
        paint(await api("GET", path));
        showError(null);
      } catch (err) {
        if (err.status !== 401) showError(err);
      }
    })();
    await refreshing;
    refreshing = null;
    if (again) {
      again = false;
      refresh();
    }
  };

  // The stream is open while the task can still change. Once it ended (its last event a
  // final state, and the task says so) the page lets the stream go, so that open tabs of
  // ended tasks hold none of the tenant's streams; a message (here or from elsewhere, seen
  // by a slow poll) opens it again after the last seq shown.
  let follower = null;
  let lastSeq = 0;
  let endedShown = false;
  const follow = () => {
    if (follower && !follower.stopped) return;
    const next = new EventFollower({
      url: path + "/events/stream",
      key: apiKey(),
      onEvent: (event) => {
        if (seen.has(event.seq)) return; // never twice, whatever the stream does
        seen.add(event.seq);
        lastSeq = Math.max(lastSeq, event.seq);
        endedShown = event.kind === "agent_state_changed" && ENDED.has(event.agent_state);
        if (event.kind === "message" && event.source === "AGENT") {
          lastQuestion = event.content;
          if (view && view.state === "AWAITING_USER_INPUT") $("agent-question").textContent = lastQuestion;
        }
        events.append(renderEvent(event, { openBlob, onFork: openFork, onRewind: rewindTo }));
        events.dataset.lastSeq = String(event.seq);
        if (nearBottom()) window.scrollTo(0, document.body.scrollHeight);
        scheduleRefresh();
      },
      onStatus: (status, detail) => {
        streamStatus.className = "stream-status " + status;
        streamStatus.textContent = status === "live" ? "live" : status + (detail ? ": " + detail : "");
        streamStatus.dataset.status = status;
        streamStatus.dataset.reconnects = String(reconnects + (follower ? follower.reconnects : 0));
        if (status === "live") refresh(); // what changed while the stream was down
      },
      onUnauthorized: () => signOut("The gateway refused the API key (unknown or revoked)."),
    });
    next.lastSeq = lastSeq;
    follower = next;
    // Tests and the curious can break the stream as a network loss would.
    window.deckhandsStream = next;
    next.start();
  };
  let reconnects = 0; // of the streams let go before this one
  const letGo = () => {
    if (!follower || follower.stopped) return;
    reconnects += follower.reconnects;
    follower.stop();
    streamStatus.className = "stream-status ended";
    streamStatus.textContent = "ended (a message continues the task)";
    streamStatus.dataset.status = "ended";
  };
  follow();
  cleanups.push(() => {
    if (follower) follower.stop();
    delete window.deckhandsStream;
  });
  onPaint = (task) => {
    if (ENDED.has(task.state) && endedShown) letGo();
    else if (!ENDED.has(task.state)) follow();
  };

  let pendingRefresh = null;
  function scheduleRefresh() {
    if (pendingRefresh) return;
    pendingRefresh = setTimeout(() => { pendingRefresh = null; refresh(); }, 200);
  }
  cleanups.push(() => clearTimeout(pendingRefresh));
  // Tokens and cost grow between events too (a sub-task's spend); a slow poll keeps them true.
  // An ended task is looked at less often: someone may continue it from elsewhere.
  let polls = 0;
  every(5000, () => {
    polls += 1;
    if (document.hidden || !view) return;
    if (!ENDED.has(view.state) || polls % 3 === 0) refresh();
  });

  function nearBottom() {
    return window.innerHeight + window.scrollY >= document.body.scrollHeight - 120;
  }

  async function openBlob(sha256) {
    try {
      await download(`${path}/blobs/${sha256}`, `${taskId}-${sha256.slice(0, 12)}.txt`);
    } catch (err) {
      if (err.status !== 401) showError(err);
    }
  }

  const control = async (button, what, body) => {
    button.disabled = true;
    try {
      await api("POST", `${path}/${what}`, { body, idempotencyKey: newIdempotencyKey() });
      showError(null);
      scheduleRefresh();
    } catch (err) {
      button.disabled = false;
      if (err.status !== 401) showError(err);
    }
  };
  // Forks: the form for one point, and the list of this task's forks.
  let forkAt = null;
  function openFork(seq) {
    forkAt = seq;
    $("fork-title").textContent = `Fork from #${seq}`;
    forkPanel.hidden = false;
    $("fork-message").focus();
  }
  const loadForks = async () => {
    try {
      const page = await api("GET", "/v1/tasks?limit=100&forked_from=" + encodeURIComponent(taskId));
      forksPanel.hidden = page.tasks.length === 0;
      forksPanel.replaceChildren(h("h2", { text: "Forks" }), h("ul", { id: "forks" }, page.tasks.map((t) =>
        h("li", { dataset: { id: t.id } }, stateBadge(t.state), " ",
          h("a", { href: "#/tasks/" + encodeURIComponent(t.id), text: t.id.slice(0, 8) }),
          h("span", { class: "muted", text: ` at #${t.forked_at}, ${t.iterations} iterations` })))));
    } catch (err) {
      if (err.status !== 401) showError(err);
    }
  };
  loadForks();
  // A rewind is for good (the task goes on from there): the first click arms the button, a
  // second within 4 s does it.
  async function rewindTo(seq, button) {
    if (!button.classList.contains("armed")) {
      button.classList.add("armed");
      button.textContent = `Rewind to #${seq}?`;
      setTimeout(() => { button.classList.remove("armed"); button.textContent = "Rewind to here"; }, 4000);
      return;
    }
    button.classList.remove("armed");
    button.textContent = "Rewind to here";
    try {
      await api("POST", `${path}/rewind`, { body: { to: seq }, idempotencyKey: newIdempotencyKey() });
      endedShown = false;
      follow(); // the task goes on from there: follow it again
      showError(null);
      scheduleRefresh();
    } catch (err) {
      if (err.status !== 401) showError(err);
    }
  }
  $("fork-cancel").addEventListener("click", () => { forkPanel.hidden = true; });
  $("fork-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    if (forkAt === null) return;
    const body = { at: forkAt, count: Number($("fork-count").value) || 1 };
    const text = $("fork-message").value;
    if (text.trim()) body.message = text;
    $("fork-submit").disabled = true;
    try {
      const made = await api("POST", `${path}/fork`, { body, idempotencyKey: newIdempotencyKey() });
      forkPanel.hidden = true;
      $("fork-message").value = "";
      showError(null);
      if (made.forks.length === 1) location.hash = "#/tasks/" + encodeURIComponent(made.forks[0].id);
      else loadForks();
    } catch (err) {
      if (err.status !== 401) showError(err);
    } finally {
      $("fork-submit").disabled = false;
    }
  });
  $("pause").addEventListener("click", (e) => control(e.currentTarget, "pause"));
  $("resume").addEventListener("click", (e) => control(e.currentTarget, "resume"));
  // Stopping and deleting are for good: the first click arms the button, a second within
  // 4 s does it.
  const twoClicks = (button, question, act) => {
    const label = button.textContent;
    button.addEventListener("click", () => {
      if (!button.classList.contains("armed")) {
        button.classList.add("armed");
        button.textContent = question;
        setTimeout(() => { button.classList.remove("armed"); button.textContent = label; }, 4000);
        return;
      }
      button.classList.remove("armed");
      button.textContent = label;
      act();
    });
  };
  twoClicks($("stop"), "Stop for good?", () => control($("stop"), "stop"));
  twoClicks($("delete-task"), "Delete task and log?", async () => {
    $("delete-task").disabled = true;
    try {
      await api("DELETE", path);
      location.hash = "#/tasks";
    } catch (err) {
      $("delete-task").disabled = false;
      if (err.status !== 401) showError(err);
    }
  });
  const confirm = (approve) => {
    const actionId = $("pending-action").dataset.actionId;
    if (!actionId) return;
    $("approve").disabled = true;
    $("reject").disabled = true;
    control(approve ? $("approve") : $("reject"), "confirmation", { action_id: actionId, approve });
  };
  $("approve").addEventListener("click", () => confirm(true));
  $("reject").addEventListener("click", () => confirm(false));
  $("message-text").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("message-form").requestSubmit();
  });
  $("message-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const text = $("message-text").value;
    if (!text.trim()) return;
    $("send-message").disabled = true;
    try {
      await api("POST", `${path}/messages`, { body: { content: text }, idempotencyKey: newIdempotencyKey() });
      endedShown = false;
      follow(); // an ended task goes on: follow it again
      $("message-text").value = "";
      showError(null);
      scheduleRefresh();
    } catch (err) {
      if (err.status !== 401) showError(err);
    } finally {
      $("send-message").disabled = false;
    }
  });
  // The workspace: its files as a tar.gz, and its changes (a git diff against where the task
  // started: its repository's commit, or the tree last uploaded) shown here.
  $("download-workspace").addEventListener("click", async () => {
    try {
      await download(`${path}/workspace`, `workspace-${taskId}.tar.gz`);
      showError(null);
    } catch (err) {
      if (err.status !== 401) showError(err);
    }
  });
  $("show-changes").addEventListener("click", async () => {
    if (!changesPanel.hidden) {
      changesPanel.hidden = true;
      return;
    }
    try {
      const response = await api("GET", `${path}/workspace/diff`, { raw: true });
      const text = await response.text();
      changesPanel.replaceChildren(h("h2", { text: "Changes in the workspace" }),
        text ? diff(text) : h("p", { class: "muted", text: "No change." }));
      changesPanel.hidden = false;
      showError(null);
    } catch (err) {
      if (err.status === 401) return;
      // E.g. a task with no repository and no upload has nothing to compare with.
      changesPanel.replaceChildren(h("h2", { text: "Changes in the workspace" }),
        h("p", { class: "muted", id: "changes-error", text: err.message }));
      changesPanel.hidden = false;
    }
  });
  $("download-trajectory").addEventListener("click", async () => {
    try {
      await download(`${path}/trajectory`, `trajectory-${taskId}.json`);
    } catch (err) {
      if (err.status !== 401) showError(err);
    }
  });
  refresh();
}

// ---- start ---------------------------------------------------------------------------------

function start() {
  $("sign-in-form").addEventListener("submit", signIn);
  $("sign-out").addEventListener("click", () => signOut());
  window.addEventListener("hashchange", route);
  if (apiKey()) {
    whoAmI().then(route, (err) => { if (err.status !== 401) showSignIn(err.message); });
  } else {
    showSignIn();
  }
}

start();
