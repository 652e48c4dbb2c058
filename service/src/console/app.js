// The sless console: a page over the tenant REST API (/api/v1) of the same
// origin. The API token lives in sessionStorage only (never in a URL or a
// log) and every request carries it; the console shows exactly what the API
// lets the token see. Everything is built with DOM nodes and textContent:
// names, messages and configs never become markup.
//
// Over 500 lines: the console is three files the binary embeds (no
// bundler, no build step), and this one holds every page.
"use strict";

const TOKEN = "sless.token";
const REFRESH_MS = 2000;
/** Throughput samples kept per dataflow: ten minutes at the refresh rate. */
const SAMPLES = 300;

const main = document.getElementById("main");
let refreshTimer = null;
/** name → [{at, written, read, failed, filtered}], newest last. */
const history = new Map();
/** Queue services whose keys are shown, and whose snippets are open. */
const revealed = new Set();
const opened = new Set();

function h(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "text") node.textContent = value;
    else if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function token() {
  return sessionStorage.getItem(TOKEN);
}

class Unauthorized extends Error {}

async function api(method, path, body) {
  const headers = { Authorization: "Bearer " + token() };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch("/api/v1" + path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    cache: "no-store",
  });
  if (response.status === 401) {
    sessionStorage.removeItem(TOKEN);
    throw new Unauthorized();
  }
  const text = await response.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch (_) {
    json = null;
  }
  return { status: response.status, json };
}

function phase(value) {
  return h("span", { class: "phase " + (value || ""), "data-phase": value || "", text: value || "?" });
}

function copyButton(text, label) {
  return h("button", {
    type: "button",
    text: label || "Copy",
    onclick: async (e) => {
      try {
        await navigator.clipboard.writeText(text);
        e.target.textContent = "Copied";
      } catch (_) {
        e.target.textContent = "Select and copy";
      }
    },
  });
}

// ---- sign-in ----------------------------------------------------------------

function signIn(reason) {
  stopRefresh();
  document.getElementById("nav").hidden = true;
  const input = h("input", { type: "password", id: "token", autocomplete: "off", required: true });
  const error = h("p", { class: "error", id: "sign-in-error", text: reason || "" });
  const form = h(
    "form",
    {
      class: "stack card",
      id: "sign-in",
      onsubmit: async (e) => {
        e.preventDefault();
        sessionStorage.setItem(TOKEN, input.value.trim());
        try {
          const probe = await api("GET", "/queue-services");
          if (probe.status !== 200) throw new Error("the API answered " + probe.status);
          location.hash = "#/";
          route();
        } catch (err) {
          signIn(err instanceof Unauthorized ? "That token is not valid." : "The API cannot be reached: " + err.message);
        }
      },
    },
    h("h1", { text: "Sign in" }),
    h("label", {}, "API token", h("span", { class: "hint", text: "Kept in this tab only; sent as a bearer token." }), input),
    h("button", { class: "primary", type: "submit", text: "Sign in" }),
    error,
  );
  main.replaceChildren(form);
  input.focus();
}

// ---- overview ---------------------------------------------------------------

function snippets(view) {
  const endpoint = view.endpoint || "";
  return [
    ["boto3", `import boto3\nsqs = boto3.client("sqs", endpoint_url="${endpoint}", region_name="ru-msk-1",\n    aws_access_key_id="${view.accessKey}", aws_secret_access_key="<secret key>")\nprint(sqs.list_queues())`],
    ["AWS CLI", `aws --endpoint-url ${endpoint} --region ru-msk-1 sqs list-queues`],
    ["Terraform outputs", `sless_queue_service.${view.name}.endpoint\nsless_queue_service.${view.name}.access_key\nsless_queue_service.${view.name}.secret_key  # sensitive`],
  ];
}

function queueServiceCard(view) {
  const shown = revealed.has(view.name);
  const secret = h("code", { class: "secret", text: shown ? view.secretKey : "••••••••" });
  const toggle = h("button", {
    type: "button",
    class: "reveal",
    text: shown ? "Hide keys" : "Show keys",
    onclick: () => {
      if (revealed.has(view.name)) revealed.delete(view.name);
      else revealed.add(view.name);
      refresh();
    },
  });
  return h(
    "article",
    { class: "card queue-service", "data-name": view.name },
    h("h3", {}, h("a", { href: "#/queue-services/" + encodeURIComponent(view.name), text: view.name }), " ", phase(view.phase)),
    h(
      "dl",
      {},
      h("dt", { text: "Endpoint" }),
      h("dd", {}, view.endpoint ? h("code", { text: view.endpoint }) : h("span", { class: "muted", text: "once Ready" })),
      h("dt", { text: "Access key" }),
      h("dd", {}, h("code", { text: view.accessKey || "" })),
      h("dt", { text: "Secret key" }),
      h("dd", { class: "row" }, secret, toggle, copyButton(view.secretKey || "", "Copy")),
      view.message ? [h("dt", { text: "Message" }), h("dd", { text: view.message })] : null,
    ),
    h(
      "details",
      {
        open: opened.has(view.name),
        ontoggle: (e) => (e.target.open ? opened.add(view.name) : opened.delete(view.name)),
      },
      h("summary", { text: "Connect" }),
      snippets(view).map(([title, text]) => [h("h4", { text: title }), h("pre", { text }), copyButton(text)]),
    ),
    h("button", {
      class: "danger",
      type: "button",
      text: "Delete",
      onclick: async () => {
        if (!confirm(`Delete queue service ${view.name} and its messages?`)) return;
        await api("DELETE", "/queue-services/" + encodeURIComponent(view.name));
        refresh();
      },
    }),
  );
}

function dataflowCard(view) {
  return h(
    "article",
    { class: "card dataflow", "data-name": view.name },
    h("h3", {}, h("a", { href: "#/dataflows/" + encodeURIComponent(view.name), text: view.name }), " ", phase(view.phase)),
    h("p", { class: "muted", text: `${view.source.type} → ${view.transformations.length} transformation(s) → ${view.sink.type}` }),
    view.message ? h("p", { text: view.message }) : null,
  );
}

async function overview() {
  const [queues, flows] = await Promise.all([api("GET", "/queue-services"), api("GET", "/dataflows")]);
  const name = h("input", { id: "new-queue-service", placeholder: "name, e.g. main", pattern: "[a-z0-9]([a-z0-9-]*[a-z0-9])?" });
  const error = h("span", { class: "field-error", id: "new-queue-service-error" });
  const create = h(
    "form",
    {
      class: "row",
      onsubmit: async (e) => {
        e.preventDefault();
        const created = await api("POST", "/queue-services", { name: name.value.trim() });
        if (created.status === 201) refresh();
        else error.textContent = created.json?.error?.message || "refused (" + created.status + ")";
      },
    },
    name,
    h("button", { class: "primary", type: "submit", text: "Create queue service" }),
    error,
  );
  return h(
    "section",
    {},
    h("h1", { text: "Overview" }),
    h("h2", { text: "Queue services" }),
    create,
    h("div", { class: "grid", id: "queue-services" }, (queues.json?.items || []).map(queueServiceCard)),
    h("h2", { text: "Dataflows" }),
    h("div", { class: "grid", id: "dataflows" }, (flows.json?.items || []).map(dataflowCard)),
    (flows.json?.items || []).length ? null : h("p", { class: "muted" }, "No dataflows yet. ", h("a", { href: "#/dataflows/new", text: "Create one" }), "."),
  );
}

// ---- the queues of a queue service -----------------------------------------

/** queue → what a peek showed ({items, receivesCounted}), until the next peek. */
const peeked = new Map();

function queuePath(service, queue) {
  return "/queue-services/" + encodeURIComponent(service) + "/queues" + (queue ? "/" + encodeURIComponent(queue) : "");
}

function queueRow(service, q) {
  const body = h("input", { id: "send-" + q.name, placeholder: "message body" });
  const shown = peeked.get(q.name);
  return h(
    "article",
    { class: "card queue", "data-queue": q.name },
    h("h3", { text: q.name + (q.fifo ? " (FIFO)" : "") }),
    h(
      "div",
      { class: "counters" },
      h("div", { class: "counter", "data-count": "visible" }, h("b", { text: String(q.visible) }), "visible"),
      h("div", { class: "counter", "data-count": "inFlight" }, h("b", { text: String(q.inFlight) }), "in flight"),
      h("div", { class: "counter", "data-count": "delayed" }, h("b", { text: String(q.delayed) }), "delayed"),
      h("div", { class: "counter", "data-count": "oldest" }, h("b", { text: q.oldestMessageAgeSeconds == null ? "–" : duration(q.oldestMessageAgeSeconds) }), "oldest message"),
    ),
    q.deadLetterQueue ? h("p", {}, "Dead letters go to ", h("code", { text: q.deadLetterQueue })) : null,
    q.deadLetterSources.length
      ? h(
          "p",
          { class: "row" },
          "Dead-letter queue of ",
          h("code", { text: q.deadLetterSources.join(", ") }),
          h("button", {
            type: "button",
            class: "redrive",
            text: "Redrive to source",
            onclick: async () => {
              await api("POST", queuePath(service, q.name) + "/redrive", {});
              refresh();
            },
          }),
        )
      : null,
    h(
      "form",
      {
        class: "row",
        onsubmit: async (e) => {
          e.preventDefault();
          await api("POST", queuePath(service, q.name) + "/messages", { body: body.value });
          body.value = "";
          refresh();
        },
      },
      body,
      h("button", { type: "submit", text: "Send test message" }),
    ),
    h(
      "div",
      { class: "row" },
      h("button", {
        type: "button",
        class: "peek",
        text: "Peek",
        onclick: async () => {
          const got = await api("GET", queuePath(service, q.name) + "/messages");
          peeked.set(q.name, { items: got.json?.items || [], receivesCounted: !!got.json?.receivesCounted });
          refresh();
        },
      }),
      h("button", {
        type: "button",
        class: "danger",
        text: "Delete queue",
        onclick: async () => {
          if (!confirm(`Delete queue ${q.name} and its messages?`)) return;
          await api("DELETE", queuePath(service, q.name));
          refresh();
        },
      }),
    ),
    shown
      ? h(
          "div",
          { class: "peeked" },
          h("p", {
            class: "muted",
            text: shown.receivesCounted
              ? "What ReceiveMessage with visibility 0 shows: this engine cannot peek without receiving, so each peek counts as a receive (and can move a message to its dead-letter queue)."
              : "What the next receive would take: the messages stay in the queue, and a peek counts as no receive.",
          }),
          shown.items.length ? shown.items.map((m) => h("pre", { text: `${m.messageId} (received ${m.receiveCount}×)\n${m.body}` })) : h("p", { text: "No message visible." }),
        )
      : null,
  );
}

/** queue service → the nextToken of the page of queues shown (none: the first). */
const queuePage = new Map();

async function queueServicePage(name) {
  const token = queuePage.get(name);
  const got = await api("GET", queuePath(name) + (token ? "?nextToken=" + encodeURIComponent(token) : ""));
  if (got.status !== 200) return h("section", {}, h("h1", { text: name }), h("p", { class: "error", text: got.json?.error?.message || "not available" }));
  const input = h("input", { id: "new-queue", placeholder: "queue name (end it in .fifo for FIFO)" });
  const error = h("span", { class: "field-error", id: "new-queue-error" });
  return h(
    "section",
    {},
    h("h1", { text: "Queues of " + name }),
    h(
      "form",
      {
        class: "row",
        onsubmit: async (e) => {
          e.preventDefault();
          const created = await api("POST", queuePath(name), { name: input.value.trim() });
          if (created.status === 201) {
            input.value = "";
            refresh();
          } else error.textContent = created.json?.error?.message || "refused (" + created.status + ")";
        },
      },
      input,
      h("button", { class: "primary", type: "submit", text: "Create queue" }),
      error,
    ),
    h("div", { class: "grid", id: "queues" }, got.json.items.map((q) => queueRow(name, q))),
    got.json.items.length ? null : h("p", { class: "muted", text: "No queues yet." }),
    h(
      "p",
      { class: "row" },
      token
        ? h("button", { type: "button", class: "first-page", text: "First page", onclick: () => { queuePage.delete(name); refresh(); } })
        : null,
      got.json.nextToken
        ? h("button", { type: "button", class: "next-page", text: "Next page", onclick: () => { queuePage.set(name, got.json.nextToken); refresh(); } })
        : null,
    ),
  );
}

// ---- a dataflow -------------------------------------------------------------

function stage(kind, spec, cls) {
  return h("div", { class: "stage " + (cls || "") }, h("small", { text: kind }), h("strong", { text: spec.type }));
}

function pipeline(view) {
  const row = [stage("source", view.source)];
  const branches = [];
  for (const t of view.transformations) {
    row.push(h("span", { class: "arrow", text: "→" }), stage("transform", t));
    if (t.type === "router") {
      for (const r of t.config?.routes || []) {
        branches.push(
          h("div", { class: "row" }, h("span", { class: "muted", text: "if " + r.condition }), h("span", { class: "arrow", text: "→" }), stage("route sink", r.sink, "sink")),
        );
      }
    }
  }
  row.push(h("span", { class: "arrow", text: "→" }), stage("sink", view.sink, "sink"));
  return h(
    "div",
    { id: "pipeline" },
    h("div", { class: "pipeline" }, row),
    branches.length ? h("div", { class: "branches" }, branches) : null,
    view.errors ? h("div", { class: "branches" }, h("div", { class: "row" }, h("span", { class: "muted", text: "refused messages" }), h("span", { class: "arrow", text: "→" }), stage("error sink", view.errors, "errors"))) : null,
  );
}

function record(view) {
  const c = view.counters;
  if (!c) return;
  const list = history.get(view.name) || [];
  list.push({ at: Date.now(), read: c.read, written: c.written, failed: c.failed, filtered: c.filtered });
  while (list.length > SAMPLES) list.shift();
  history.set(view.name, list);
}

/** Whole seconds as "42 s", "3 min 5 s", "2 h 10 min". */
function duration(seconds) {
  if (seconds < 60) return seconds + " s";
  if (seconds < 3600) return Math.floor(seconds / 60) + " min " + (seconds % 60) + " s";
  return Math.floor(seconds / 3600) + " h " + Math.floor((seconds % 3600) / 60) + " min";
}

function eventList(items) {
  if (!items.length) return h("p", { class: "muted", text: "No events yet." });
  return h(
    "ul",
    { class: "events", id: "events" },
    items.map((e) =>
      h(
        "li",
        { class: e.kind === "Warning" ? "warning" : null, "data-reason": e.reason },
        h("span", { class: "muted", text: new Date(e.at).toLocaleTimeString() + " " }),
        h("b", { text: e.reason }),
        " " + e.message + (e.count > 1 ? ` (×${e.count})` : ""),
      ),
    ),
  );
}

function drawChart(canvas, samples) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 600;
  const height = canvas.clientHeight || 180;
  canvas.width = width * ratio;
  canvas.height = height * ratio;
  const g = canvas.getContext("2d");
  g.scale(ratio, ratio);
  g.clearRect(0, 0, width, height);
  const rates = [];
  for (let i = 1; i < samples.length; i++) {
    const dt = (samples[i].at - samples[i - 1].at) / 1000 || 1;
    rates.push({
      written: Math.max(0, (samples[i].written - samples[i - 1].written) / dt),
      read: Math.max(0, (samples[i].read - samples[i - 1].read) / dt),
    });
  }
  const top = Math.max(1, ...rates.map((r) => Math.max(r.read, r.written)));
  g.fillStyle = "#66707a";
  g.font = "12px system-ui";
  g.fillText(`${Math.round(top)} msg/s`, 6, 14);
  const line = (key, color) => {
    g.strokeStyle = color;
    g.lineWidth = 2;
    g.beginPath();
    rates.forEach((r, i) => {
      const x = rates.length < 2 ? width : (i / (rates.length - 1)) * width;
      const y = height - 4 - (r[key] / top) * (height - 24);
      if (i === 0) g.moveTo(x, y);
      else g.lineTo(x, y);
    });
    g.stroke();
  };
  line("read", "#2557a7");
  line("written", "#137333");
}

function age(iso) {
  if (!iso) return "never";
  const seconds = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  return seconds + " s ago";
}

async function dataflowPage(name) {
  const got = await api("GET", "/dataflows/" + encodeURIComponent(name));
  if (got.status !== 200) return h("section", {}, h("h1", { text: name }), h("p", { class: "error", text: got.json?.error?.message || "not found" }));
  const view = got.json;
  record(view);
  const events = await api("GET", "/dataflows/" + encodeURIComponent(name) + "/events");
  const c = view.counters || {};
  const counter = (key, label) => h("div", { class: "counter", "data-counter": key }, h("b", { text: String(c[key] ?? 0) }), label);
  const canvas = h("canvas", { id: "throughput", "aria-label": "throughput chart" });
  requestAnimationFrame(() => drawChart(canvas, history.get(name) || []));
  return h(
    "section",
    {},
    h("h1", {}, view.name + " ", phase(view.phase)),
    view.message ? h("p", { id: "message", text: view.message }) : null,
    pipeline(view),
    h("h2", { text: "Counters" }),
    h("div", { class: "counters", id: "counters" }, counter("read", "read"), counter("written", "written"), counter("failed", "failed"), counter("filtered", "filtered"), h("div", { class: "counter" }, h("b", { id: "checkpoint-age", text: age(c.lastCheckpointAt) }), "checkpoint")),
    h("h2", { text: "Throughput (read blue, written green), since this page opened" }),
    canvas,
    h("h2", { text: "Recent events" }),
    eventList(events.status === 200 ? events.json.items : []),
    h("p", { class: "row" }, h("a", { href: "#/dataflows/" + encodeURIComponent(name) + "/edit", text: "Edit" }), h("button", {
      class: "danger",
      type: "button",
      text: "Delete",
      onclick: async () => {
        if (!confirm(`Delete dataflow ${name}?`)) return;
        await api("DELETE", "/dataflows/" + encodeURIComponent(name));
        location.hash = "#/";
      },
    })),
  );
}

// ---- create and edit --------------------------------------------------------

const EXAMPLE = {
  source: { type: "postgresql", config: { connectionString: "postgres://user:password@db:5432/app", table: "orders" } },
  sink: { type: "postgresql", config: { connectionString: "postgres://user:password@dwh:5432/dwh", table: "orders_copy", autoCreateTable: true } },
  transformations: [{ type: "mask", config: { fields: ["card"], keepLength: true } }],
};

/** The form part a 422's `field` names. */
function partOf(field) {
  if (!field) return "name";
  const head = field.split(/[.[]/)[0];
  return ["name", "source", "sink", "transformations", "errors"].includes(head) ? head : "name";
}

function editor(existing) {
  const spec = existing || EXAMPLE;
  const parts = {};
  const part = (key, label, hint, value, control) => {
    const error = h("span", { class: "field-error", "data-error-for": key });
    const wrap = h("label", { "data-field": key }, label, hint ? h("span", { class: "hint", text: hint }) : null, control, error);
    parts[key] = { wrap, error, control };
    return wrap;
  };
  const json = (value) => h("textarea", { spellcheck: "false" }, JSON.stringify(value, null, 2));
  const form = h(
    "form",
    { class: "stack", id: "dataflow-form", onsubmit: (e) => submit(e) },
    part("name", "Name", "a DNS label", null, h("input", { value: existing ? existing.name : "", readonly: !!existing, required: true })),
    part("source", "Source", "{ type, config }", null, json(spec.source)),
    part("transformations", "Transformations", "a list of { type, config }, applied in order", null, json(spec.transformations || [])),
    part("sink", "Sink", "{ type, config }", null, json(spec.sink)),
    part("errors", "Error sink", "optional { type, config }, or null", null, json(spec.errors || null)),
    h("div", { class: "row" }, h("button", { class: "primary", type: "submit", text: existing ? "Save" : "Create" }), h("span", { class: "error", id: "form-error" })),
  );
  async function submit(e) {
    e.preventDefault();
    for (const p of Object.values(parts)) {
      p.wrap.classList.remove("invalid");
      p.error.textContent = "";
    }
    form.querySelector("#form-error").textContent = "";
    const body = { name: parts.name.control.value.trim() };
    for (const key of ["source", "transformations", "sink", "errors"]) {
      try {
        body[key] = JSON.parse(parts[key].control.value || "null");
      } catch (err) {
        parts[key].wrap.classList.add("invalid");
        parts[key].error.textContent = "not JSON: " + err.message;
        return;
      }
    }
    if (body.errors === null) delete body.errors;
    const sent = existing
      ? await api("PUT", "/dataflows/" + encodeURIComponent(existing.name), body)
      : await api("POST", "/dataflows", body);
    if (sent.status === 200 || sent.status === 201) {
      location.hash = "#/dataflows/" + encodeURIComponent(body.name);
      return;
    }
    const problem = sent.json?.error || {};
    const target = parts[partOf(problem.field)];
    target.wrap.classList.add("invalid");
    const text = problem.message || "refused (" + sent.status + ")";
    target.error.textContent = problem.field && !text.startsWith(problem.field) ? problem.field + ": " + text : text;
    target.control.focus();
  }
  return h("section", {}, h("h1", { text: existing ? "Edit " + existing.name : "New dataflow" }), h("p", { class: "muted", text: "The API checks the spec before anything runs; a problem is shown at the part it names." }), form);
}

// ---- routing and refresh ----------------------------------------------------

function stopRefresh() {
  if (refreshTimer) clearInterval(refreshTimer);
  refreshTimer = null;
}

/** Renders the current page; pages with forms render once, others refresh. */
async function route() {
  if (!token()) return signIn();
  document.getElementById("nav").hidden = false;
  stopRefresh();
  const path = location.hash.replace(/^#/, "") || "/";
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  try {
    if (parts[0] === "dataflows" && parts[1] === "new") {
      main.replaceChildren(editor(null));
    } else if (parts[0] === "dataflows" && parts[2] === "edit") {
      const got = await api("GET", "/dataflows/" + encodeURIComponent(parts[1]));
      main.replaceChildren(got.status === 200 ? editor(got.json) : h("p", { class: "error", text: "not found" }));
    } else {
      await refresh();
      refreshTimer = setInterval(refresh, REFRESH_MS);
    }
  } catch (err) {
    if (err instanceof Unauthorized) signIn("Signed out: the token is no longer valid.");
    else main.replaceChildren(h("p", { class: "error", text: "The API cannot be reached: " + err.message }));
  }
}

async function refresh() {
  const path = location.hash.replace(/^#/, "") || "/";
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  try {
    const page =
      parts[0] === "dataflows" && parts[1]
        ? await dataflowPage(parts[1])
        : parts[0] === "queue-services" && parts[1]
          ? await queueServicePage(parts[1])
          : await overview();
    // Keep what the user is typing across the refresh.
    const focused = document.activeElement;
    const typing = focused && focused.id && focused.tagName === "INPUT" ? [focused.id, focused.value] : null;
    main.replaceChildren(page);
    if (typing) {
      const input = document.getElementById(typing[0]);
      if (input) {
        input.value = typing[1];
        input.focus();
      }
    }
  } catch (err) {
    if (err instanceof Unauthorized) signIn("Signed out: the token is no longer valid.");
    else console.error("refresh failed:", err);
  }
}

document.getElementById("sign-out").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN);
  history.clear();
  revealed.clear();
  opened.clear();
  signIn();
});
window.addEventListener("hashchange", route);
route();
