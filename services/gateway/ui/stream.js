// A task's live events: Server-Sent Events read with fetch(), since EventSource cannot send
// the Authorization header. After a network loss (or a gateway restart) it reconnects with
// Last-Event-ID = the last seq it handed out, and drops anything at or below that seq, so an
// event is shown once however often the connection breaks.
"use strict";

const MAX_BACKOFF_MS = 15000;

export class EventFollower {
  // url: the stream's path; key: the API key; onEvent(event): each event once, in seq order;
  // onStatus(status, detail): "connecting" | "live" | "reconnecting" | "ended" | "failed";
  // idleMs: with no byte for this long (the gateway sends a comment every 15 s when idle) the
  // connection is taken as lost.
  constructor({ url, key, onEvent, onStatus, onUnauthorized, idleMs = 40000 }) {
    this.url = url;
    this.key = key;
    this.onEvent = onEvent;
    this.onStatus = onStatus || (() => {});
    this.onUnauthorized = onUnauthorized || (() => {});
    this.idleMs = idleMs;
    this.lastSeq = 0;
    this.retryMs = 2000;
    this.reconnects = 0;
    this.dropped = 0; // events seen again after a reconnect, not shown twice
    this.stopped = false;
    this.controller = null;
  }

  start() {
    this._loop();
    return this;
  }

  stop() {
    this.stopped = true;
    if (this.controller) this.controller.abort();
  }

  // Breaks the current connection as a network loss would (the page's "reconnect" and tests).
  interrupt() {
    if (this.controller) this.controller.abort();
  }

  async _loop() {
    let attempt = 0;
    while (!this.stopped) {
      const controller = new AbortController();
      this.controller = controller;
      let watchdog = null;
      const arm = () => {
        clearTimeout(watchdog);
        watchdog = setTimeout(() => controller.abort(), this.idleMs);
      };
      let waitMs = null;
      try {
        this.onStatus(attempt === 0 && this.reconnects === 0 ? "connecting" : "reconnecting");
        const headers = { Authorization: "Bearer " + this.key, Accept: "text/event-stream" };
        if (this.lastSeq > 0) headers["Last-Event-ID"] = String(this.lastSeq);
        arm();
        const response = await fetch(this.url, {
          headers,
          signal: controller.signal,
          cache: "no-store",
          credentials: "omit",
        });
        if (response.status === 401) {
          clearTimeout(watchdog);
          this.onStatus("failed", "the API key was refused");
          this.onUnauthorized();
          return;
        }
        if (response.status === 404) {
          clearTimeout(watchdog);
          this.onStatus("failed", "no such task");
          return;
        }
        if (!response.ok) {
          const retryAfter = Number(response.headers.get("Retry-After"));
          if (retryAfter > 0) waitMs = retryAfter * 1000;
          throw new Error("HTTP " + response.status);
        }
        attempt = 0;
        this.onStatus("live");
        await this._read(response.body.getReader(), arm);
      } catch (err) {
        if (this.stopped) return;
      } finally {
        clearTimeout(watchdog);
      }
      if (this.stopped) return;
      attempt += 1;
      this.reconnects += 1;
      this.onStatus("reconnecting");
      const backoff = Math.min(this.retryMs * 2 ** Math.min(attempt - 1, 4), MAX_BACKOFF_MS);
      await new Promise((resolve) => setTimeout(resolve, waitMs ?? backoff));
    }
  }

  async _read(reader, arm) {
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      arm();
      buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        this._frame(block);
      }
    }
  }

  _frame(block) {
    let id = null;
    const data = [];
    for (const line of block.split("\n")) {
      if (!line || line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "id") id = value;
      else if (field === "data") data.push(value);
      else if (field === "retry" && /^\d+$/.test(value)) this.retryMs = Number(value);
    }
    if (data.length === 0) return;
    let event;
    try {
      event = JSON.parse(data.join("\n"));
    } catch (err) {
      return;
    }
    const seq = Number.isInteger(event.seq) ? event.seq : Number(id);
    if (!(seq > this.lastSeq)) {
      this.dropped += 1;
      return;
    }
    this.lastSeq = seq;
    this.onEvent(event);
  }
}
