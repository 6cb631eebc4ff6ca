// fence console: renders the views the node pushes on /ui/events.
// Every text from the server (lock names, owners) is user input: it goes
// into the page through textContent and text nodes only, never as HTML.
"use strict";

(function () {
  let view = null;
  let receivedAt = 0;

  // el makes an element with a class; children are nodes or strings, and
  // strings become text nodes.
  function el(tag, className, ...children) {
    const e = document.createElement(tag);
    if (className) e.className = className;
    for (const c of children) {
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  function setText(id, text) {
    document.getElementById(id).textContent = text;
  }

  function fill(tableID, rows, columns, emptyText) {
    const body = document.querySelector("#" + tableID + " tbody");
    if (rows.length === 0) {
      const td = el("td", "empty", emptyText);
      td.colSpan = columns;
      body.replaceChildren(el("tr", "", td));
      return;
    }
    body.replaceChildren(...rows);
  }

  function duration(ms) {
    if (ms < 0) return "-";
    if (ms < 10000) return (ms / 1000).toFixed(1) + "s";
    if (ms < 120000) return Math.round(ms / 1000) + "s";
    return Math.round(ms / 60000) + "m";
  }

  function sessionChip(h, withToken) {
    const chip = el("span", withToken ? "chip holder" : "chip waiter");
    chip.dataset.session = h.session;
    chip.append("session " + h.session);
    if (h.owner) chip.append(" (" + h.owner + ")");
    if (withToken) {
      chip.dataset.token = h.token;
      chip.append(" token ", el("span", "token", h.token));
    }
    if (h.mode && h.mode !== "exclusive") chip.append(" " + h.mode);
    return chip;
  }

  function renderLocks(v) {
    const rows = (v.locks || []).map((l) => {
      const name = el("td", "name", l.name);
      if (l.permits) name.append(el("div", "muted", l.permits + " permits"));
      if (l.delayMs) name.append(el("div", "muted", "lock-delay " + duration(l.delayMs)));
      const holders = el("td", "holders", ...l.holders.map((h) => sessionChip(h, true)));
      const waiters = el("td", "waiters", ...l.waiters.map((w, i) => {
        const c = sessionChip(w, false);
        c.prepend((i + 1) + ". ");
        return c;
      }));
      const tr = el("tr", "lock", name, holders, waiters);
      tr.dataset.lock = l.name;
      return tr;
    });
    fill("locks", rows, 3, "no lock is held or waited for");
    const shown = (v.locks || []).length;
    setText("locks-more", v.numLocks > shown ? "showing " + shown + " of " + v.numLocks + " locks" : "");
  }

  function renderSessions(v) {
    const rows = (v.sessions || []).map((s) => {
      const left = el("td", "ttl-left", "-");
      left.dataset.leftMs = s.ttlLeftMs;
      const tr = el("tr", "session", el("td", "", s.id), el("td", "name", s.owner || "-"), el("td", "", duration(s.ttlMs)), left);
      tr.dataset.session = s.id;
      return tr;
    });
    fill("sessions", rows, 4, "no sessions");
    const shown = (v.sessions || []).length;
    let note = v.numSessions > shown ? "showing " + shown + " of " + v.numSessions + " sessions. " : "";
    if (!v.ttlLeftKnown) note += "TTL left is known on the leader only.";
    setText("sessions-more", note);
    tickTTLs();
  }

  // eventText says what happened: "granted" (with a mode other than
  // exclusive), "released", or how the holder's session ended.
  function eventText(e) {
    if (e.kind === "granted") return "granted" + (e.mode && e.mode !== "exclusive" ? " (" + e.mode + ")" : "");
    if (e.end) return "session " + e.end;
    return e.kind;
  }

  function renderEvents(v) {
    const rows = (v.events || []).map((e) => {
      const t = new Date(e.time);
      return el("tr", "event kind-" + e.kind,
        el("td", "", t.toLocaleTimeString()),
        el("td", "", eventText(e)),
        el("td", "name", e.lock || ""),
        el("td", "", e.session),
        el("td", "token", e.token || ""));
    });
    fill("events", rows, 5, "nothing yet since this node started");
  }

  function renderNodes(v) {
    const rows = (v.members || []).map((m) => el("tr", "",
      el("td", "", m.id + (m.self ? " (this node)" : "")),
      el("td", "role-" + m.role, m.role),
      el("td", "name", m.apiAddress || "-"),
      el("td", "name", m.raftAddress)));
    fill("nodes", rows, 4, "no raft configuration yet");
  }

  function render(v) {
    view = v;
    receivedAt = performance.now();
    setText("node", "node " + v.node + (v.clusterId ? " · cluster " + v.clusterId : "") + " · " + v.version);
    setText("last-token", v.lastToken);
    let raft = v.state;
    if (v.state !== "Leader") raft += v.leader ? " (leader " + v.leader + ")" : " (no leader)";
    setText("raft", raft);
    setText("indexes", v.term + " / " + v.commitIndex + " / " + v.appliedIndex);
    setText("counts", v.numSessions + " / " + v.numLocks);
    document.getElementById("problems").replaceChildren(...(v.problems || []).map((p) => el("div", "problem", p)));
    renderNodes(v);
    renderLocks(v);
    renderSessions(v);
    renderEvents(v);
  }

  // tickTTLs counts the TTLs left down between pushes, on this page's clock.
  function tickTTLs() {
    if (!view) return;
    const gone = performance.now() - receivedAt;
    for (const td of document.querySelectorAll("#sessions td.ttl-left")) {
      const left = Number(td.dataset.leftMs);
      td.textContent = left < 0 ? "-" : duration(Math.max(0, left - gone));
    }
  }

  function setLive(on, text) {
    const live = document.getElementById("live");
    live.className = on ? "live" : "live off";
    live.textContent = text;
  }

  function connect() {
    const source = new EventSource("events");
    source.addEventListener("view", (ev) => {
      setLive(true, "live");
      render(JSON.parse(ev.data));
    });
    // The node ends the stream when its caller may no longer read it (a
    // token revoked or expired, a permission taken): reconnecting would be
    // refused too.
    source.addEventListener("end", (ev) => {
      source.close();
      setLive(false, "ended: " + JSON.parse(ev.data).error);
    });
    source.addEventListener("error", () => setLive(false, "reconnecting"));
  }

  setInterval(tickTTLs, 250);
  connect();
})();
