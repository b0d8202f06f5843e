// The compaction-proxy dashboard: reads /admin/stats, /admin/keys and /admin/budgets
// with the admin key and draws them; plain JavaScript, charts as SVG, no library.
//
// Every figure taken from /admin/stats is an element with data-stat (its JSON path, an
// array) and data-format ("int", "share" or "cost"); the browser tests read them back
// and compare with /admin/stats, formatting as `format` below does.
"use strict";

(() => {
  const STORAGE = "compaction-proxy-admin-key";
  const REFRESH_MS = 5000;
  const SVG_NS = "http://www.w3.org/2000/svg";
  const WINDOW_NAMES = {
    last_hour: "last hour",
    last_day: "last 24 hours",
    since_start: "since this replica started",
  };

  let adminKey = "";
  let timer = 0;
  let latest = null; // {stats, keys, budgets}

  const $ = (id) => document.getElementById(id);

  // -- formatting (tests/server/test_dashboard.py `shown` mirrors these) ------------------------------

  function grouped(n) {
    return Math.round(n).toLocaleString("en-US");
  }

  function money(value) {
    const micro = Math.round(Math.abs(value) * 1e6);
    const sign = value < 0 && micro > 0 ? "-" : "";
    if (micro >= 995000 || micro === 0) {
      const cents = Math.floor((micro + 5000) / 10000);
      return `${sign}${grouped(Math.floor(cents / 100))}.${String(cents % 100).padStart(2, "0")}`;
    }
    return `${sign}0.${String(Math.floor((micro + 50) / 100)).padStart(4, "0")}`;
  }

  const format = {
    int: (v) => grouped(v),
    share: (v) => `${(v * 100).toFixed(2)}%`,
    cost: (v) => money(v),
  };

  // Axis ticks only: short, not compared by the tests.
  const compact = new Intl.NumberFormat("en-US", { notation: "compact", maximumFractionDigits: 1 });

  function show(value, kind) {
    return value === null || value === undefined ? "–" : format[kind](value);
  }

  function at(root, path) {
    let here = root;
    for (const part of path) {
      if (here === null || here === undefined) return undefined;
      here = here[part];
    }
    return here;
  }

  function clock(unix) {
    return new Date(unix * 1000).toLocaleTimeString("en-GB", { hour12: false });
  }

  // -- DOM helpers ---------------------------------------------------------------------

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(props || {})) {
      if (name === "class") node.className = value;
      else if (name === "data") Object.assign(node.dataset, value);
      else if (name === "text") node.textContent = value;
      else node.setAttribute(name, value);
    }
    for (const child of children) {
      if (child !== null && child !== undefined) {
        node.append(child instanceof Node ? child : document.createTextNode(String(child)));
      }
    }
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // A figure from /admin/stats, marked for the tests.
  function stat(root, path, kind, tag) {
    return el(tag || "span", {
      class: `figure ${kind}`,
      data: { stat: JSON.stringify(path), format: kind },
      text: show(at(root, path), kind),
    });
  }

  function table(node, headings, rows) {
    node.replaceChildren(
      el("thead", {}, el("tr", {}, ...headings.map((h) => el("th", { scope: "col", text: h })))),
      el("tbody", {}, ...rows.map((cells) => el("tr", {}, ...cells.map((c) => el("td", {}, c))))),
    );
    if (!rows.length) {
      node.tBodies[0].append(
        el("tr", {}, el("td", { colspan: String(headings.length), class: "empty", text: "nothing yet" })),
      );
    }
  }

  // -- the API ---------------------------------------------------------------------------

  class Refused extends Error {}

  async function api(method, path, body) {
    const headers = { Authorization: `Bearer ${adminKey}` };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
      credentials: "omit",
    });
    const data = await response.json().catch(() => null);
    if (response.status === 401) throw new Refused(data?.error?.message || "refused");
    if (!response.ok) throw new Error(data?.error?.message || `HTTP ${response.status}`);
    return data;
  }

  // -- rendering -------------------------------------------------------------------------

  function chosenWindow(stats) {
    const wanted = $("window").value;
    return stats[wanted] ? wanted : "since_start";
  }

  function units(summary) {
    return Object.keys((summary && summary.cost) || {});
  }

  function card(title, ...lines) {
    return el("div", { class: "card" }, el("h3", { text: title }), ...lines);
  }

  function wide(title, ...lines) {
    const made = card(title, ...lines);
    made.classList.add("wide");
    return made;
  }

  function line(label, figure) {
    return el("p", { class: "line" }, el("span", { class: "label", text: label }), figure);
  }

  function renderCards(stats, w) {
    const s = stats[w];
    const cards = [
      card("Requests", stat(stats, [w, "requests"], "int", "p"),
        line("errors", stat(stats, [w, "errors"], "int"))),
      card("History tokens saved", stat(stats, [w, "history_tokens", "saved"], "int", "p"),
        line("rewritten requests", stat(stats, [w, "history_tokens", "rewritten_requests"], "int"))),
      card("Cache-read share", stat(stats, [w, "cache_read_share"], "share", "p"),
        line("cache reads", stat(stats, [w, "tokens", "cache_read_input_tokens"], "int"))),
    ];
    for (const unit of units(s)) {
      cards.push(wide(`Cost (${unit.replaceAll("_", " ")})`,
        line("with the proxy", stat(stats, [w, "cost", unit, "with_proxy"], "cost")),
        line("without it", stat(stats, [w, "cost", unit, "without_proxy"], "cost")),
        line("saved", stat(stats, [w, "cost", unit, "saved"], "cost"))));
    }
    cards.push(
      card("Crossings", stat(stats, [w, "crossings"], "int", "p"),
        line("summaries made", stat(stats, [w, "summaries", "made"], "int")),
        line("made ahead", stat(stats, [w, "summaries", "ahead"], "int")),
        line("waited for", stat(stats, [w, "summaries", "waited"], "int")),
        line("summaries reused", stat(stats, [w, "summaries", "reused"], "int"))),
      card("Read rounds", stat(stats, [w, "read_rounds"], "int", "p"),
        line("results offloaded", stat(stats, [w, "offloaded_results"], "int"))),
      card("Budget refusals", stat(stats, [w, "budget_refusals"], "int", "p"),
        line("window refusals", stat(stats, [w, "refusals", "window"], "int"))),
    );
    $("cards").replaceChildren(...cards);
  }

  function chartFrame(container) {
    const width = Math.max(280, container.clientWidth || 600);
    const height = 170;
    const pad = { left: 44, right: 8, top: 10, bottom: 24 };
    const root = svg("svg", {
      viewBox: `0 0 ${width} ${height}`, width: "100%", height: String(height), role: "img",
    });
    return { root, width, height, pad, plotW: width - pad.left - pad.right, plotH: height - pad.top - pad.bottom };
  }

  function axes(frame, points, top) {
    const { root, pad, plotW, plotH, height } = frame;
    root.append(
      svg("line", { x1: pad.left, y1: pad.top + plotH, x2: pad.left + plotW, y2: pad.top + plotH, class: "axis" }),
      svg("text", { x: pad.left - 6, y: pad.top + 8, class: "tick end" }, compact.format(top)),
      svg("text", { x: pad.left - 6, y: pad.top + plotH, class: "tick end" }, "0"),
    );
    if (points.length) {
      root.append(
        svg("text", { x: pad.left, y: height - 6, class: "tick" }, clock(points[0].start_unix)),
        svg("text", { x: pad.left + plotW, y: height - 6, class: "tick end" },
          clock(points[points.length - 1].start_unix)),
      );
    }
  }

  function barChart(container, points, value, kind) {
    const frame = chartFrame(container);
    const top = Math.max(1, ...points.map(value));
    axes(frame, points, top);
    const step = frame.plotW / Math.max(1, points.length);
    points.forEach((point, i) => {
      const v = value(point);
      const h = (v / top) * frame.plotH;
      const bar = svg("rect", {
        x: frame.pad.left + i * step + step * 0.1, y: frame.pad.top + frame.plotH - h,
        width: Math.max(1, step * 0.8), height: Math.max(0, h), class: "bar",
      });
      bar.append(svg("title", {}, `${clock(point.start_unix)}: ${show(v, kind)}`));
      frame.root.append(bar);
    });
    container.replaceChildren(frame.root);
  }

  function lineChart(container, points, series, kind) {
    const frame = chartFrame(container);
    const top = Math.max(1e-6, ...points.flatMap((p) => series.map((s) => s.value(p))));
    axes(frame, points, top);
    const step = frame.plotW / Math.max(1, points.length - 1);
    for (const s of series) {
      const coords = points.map((p, i) =>
        `${(frame.pad.left + i * step).toFixed(1)},${(frame.pad.top + frame.plotH - (s.value(p) / top) * frame.plotH).toFixed(1)}`);
      if (coords.length) frame.root.append(svg("polyline", { points: coords.join(" "), class: `line ${s.name}` }));
    }
    container.replaceChildren(frame.root);
  }

  function renderCharts(stats) {
    const points = stats[$("series").value] || [];
    barChart($("chart-saved"), points, (p) => p.history_tokens.saved, "int");
    const unit = points.map((p) => Object.keys(p.cost || {})).flat().find((u) => u !== "cache_model_units")
      || "cache_model_units";
    $("chart-unit").textContent = unit.replaceAll("_", " ");
    const cost = (p, side) => (p.cost && p.cost[unit] ? p.cost[unit][side] : 0);
    lineChart($("chart-cost"), points, [
      { name: "with", value: (p) => cost(p, "with_proxy") },
      { name: "without", value: (p) => cost(p, "without_proxy") },
    ], "cost");
  }

  function renderCost(stats) {
    const rows = [];
    for (const w of ["last_hour", "last_day", "since_start"]) {
      for (const unit of units(stats[w])) {
        rows.push([
          WINDOW_NAMES[w], unit.replaceAll("_", " "),
          stat(stats, [w, "cost", unit, "with_proxy"], "cost"),
          stat(stats, [w, "cost", unit, "without_proxy"], "cost"),
          stat(stats, [w, "cost", unit, "saved"], "cost"),
        ]);
      }
    }
    table($("cost-table"), ["window", "unit", "with the proxy", "without it", "saved"], rows);
    $("cost-model").textContent = stats.cost_model;
  }

  function renderConversations(stats) {
    const items = stats.recent.conversations;
    const top = Math.max(1, ...items.map((c) => c.context_tokens_before));
    const rows = items.map((c) => {
      const before = el("span", { class: "before" });
      before.style.width = `${(c.context_tokens_before / top) * 100}%`;
      const after = el("span", { class: "after" });
      after.style.width = `${(c.context_tokens_after / top) * 100}%`;
      return el("div", { class: "bar-row" },
        el("p", { class: "bar-label" },
          el("code", { text: c.conversation }),
          ` ${c.model || "?"} · ${c.team || "no team"} · ${c.strategy} · ${clock(c.at)}`),
        el("div", { class: "track", title: "before / after" }, before, after),
        el("p", { class: "bar-figures",
          text: `${grouped(c.context_tokens_before)} → ${grouped(c.context_tokens_after)} tokens` }));
    });
    $("conversations").replaceChildren(...(rows.length ? rows : [el("p", { class: "empty", text: "nothing yet" })]));
  }

  function renderCrossings(stats) {
    table($("crossings"),
      ["time", "conversation", "model", "team", "strategy", "reason", "history before → after", "summary"],
      stats.recent.crossings.map((c) => [
        clock(c.at), el("code", { text: c.conversation || "" }), c.model || "?", c.team || "",
        c.strategy, c.reason,
        `${grouped(c.history_tokens_before)} → ${grouped(c.history_tokens_after)}`, c.summary,
      ]));
  }

  function budgetMeter(report, period, metric) {
    const used = report.used[period][metric];
    const limit = report.limits[period][metric];
    const meter = el("meter", { min: "0", max: String(Math.max(1, limit)), value: String(Math.min(used, limit)) });
    if (used >= limit) meter.classList.add("full");
    return el("div", { class: "meter-row" },
      el("span", { class: "label", text: `${period} ${metric}` }), meter,
      el("span", {
        class: "figure",
        data: { budget: JSON.stringify([report.kind, report.id, period, metric]) },
        text: `${grouped(used)} / ${grouped(limit)}`,
      }));
  }

  function renderBudgets(budgets, keys) {
    const names = new Map(keys.map((k) => [k.id, k.name]));
    const revoked = new Set(keys.filter((k) => k.revoked === "1").map((k) => k.id));
    const shown = [];
    let unlimited = 0;
    for (const report of budgets) {
      if (report.kind === "key" && revoked.has(report.id)) continue;
      const meters = [];
      for (const period of Object.keys(report.limits)) {
        for (const metric of Object.keys(report.limits[period])) meters.push(budgetMeter(report, period, metric));
      }
      if (!meters.length) { unlimited += 1; continue; }
      const title = report.kind === "key" && names.get(report.id)
        ? `key ${report.id} (${names.get(report.id)})` : report.scope;
      shown.push(el("div", { class: "card budget", data: { scope: report.scope } }, el("h3", { text: title }), ...meters));
    }
    if (unlimited) shown.push(el("p", { class: "note", text: `${unlimited} keys or teams without limits` }));
    $("budgets").replaceChildren(...shown);
    const options = [
      ...keys.filter((k) => k.revoked !== "1").map((k) => el("option", { value: k.id, label: `key ${k.name || k.id}` })),
      ...[...new Set(keys.map((k) => k.team))].map((t) => el("option", { value: t, label: `team ${t}` })),
    ];
    $("budget-names").replaceChildren(...options);
  }

  function renderKeys(keys) {
    table($("keys"), ["id", "name", "team", "provider", "scopes", "tenant", "created", "state", ""],
      keys.map((k) => {
        const active = k.revoked !== "1";
        const action = active
          ? el("button", { type: "button", class: "danger", data: { revoke: k.id }, text: "Revoke" })
          : "";
        // Keys made before providers were bound are read by their scheme (proxy_keys.py).
        const provider = k.provider || (k.upstream_scheme === "bearer" ? "openai" : "anthropic");
        return [el("code", { text: k.id }), k.name || "", k.team, provider,
          k.scopes || "metered only", k.tenant || "own", clock(Number(k.created)),
          active ? "active" : "revoked", action];
      }));
  }

  function renderDimension(node, stats, w, dimension, heading) {
    const rows = Object.keys(stats[w][dimension] || {}).sort().map((name) => {
      const path = [w, dimension, name];
      return [name,
        stat(stats, [...path, "requests"], "int"),
        stat(stats, [...path, "errors"], "int"),
        stat(stats, [...path, "history_tokens_saved"], "int"),
        stat(stats, [...path, "cache_read_share"], "share"),
        stat(stats, [...path, "cost", "cache_model_units", "with_proxy"], "cost"),
        stat(stats, [...path, "cost", "cache_model_units", "without_proxy"], "cost"),
        stat(stats, [...path, "crossings"], "int")];
    });
    table(node, [heading, "requests", "errors", "tokens saved", "cache-read share",
      "cost with (units)", "cost without (units)", "crossings"], rows);
  }

  function renderErrors(stats, w) {
    const statuses = Object.keys(stats[w].by_status || {}).filter((s) => Number(s) >= 400).sort();
    $("errors-by-status").replaceChildren(...statuses.map((s) =>
      el("span", { class: "chip" }, `${s}: `, stat(stats, [w, "by_status", s], "int"))));
    table($("errors"), ["time", "route", "status", "what", "model", "team", "key"],
      stats.recent.errors.map((e) => [clock(e.at), e.route, String(e.status), e.kind, e.model || "",
        e.team || "", e.key || ""]));
  }

  function render() {
    if (!latest) return;
    const { stats, keys, budgets } = latest;
    const w = chosenWindow(stats);
    renderCards(stats, w);
    renderCharts(stats);
    renderCost(stats);
    renderConversations(stats);
    renderCrossings(stats);
    renderBudgets(budgets, keys);
    renderKeys(keys);
    renderDimension($("by-model"), stats, w, "by_model", "model");
    renderDimension($("by-team"), stats, w, "by_team", "team");
    renderErrors(stats, w);
    const status = $("status");
    const fleet = stats.fleet_error ? ` · ${stats.fleet_error}` : " · fleet figures from Redis";
    status.textContent = `Updated ${clock(stats.generated_at_unix)} · replica ${stats.replica.name}${fleet}`;
    status.dataset.generated = String(stats.generated_at_unix);
    status.classList.toggle("error", Boolean(stats.fleet_error));
  }

  // -- the loop and the forms ------------------------------------------------------------

  async function refresh() {
    clearTimeout(timer);
    try {
      const [stats, keys, budgets] = await Promise.all([
        api("GET", "/admin/stats?minutes=60&hours=24"),
        api("GET", "/admin/keys"),
        api("GET", "/admin/budgets"),
      ]);
      latest = { stats, keys: keys.keys, budgets: budgets.budgets };
      render();
    } catch (error) {
      if (error instanceof Refused) return logOut("The proxy refused that admin key.");
      const status = $("status");
      status.textContent = `Cannot read the proxy (${error.message}); retrying`;
      status.classList.add("error");
    }
    timer = setTimeout(refresh, REFRESH_MS);
  }

  function logIn(key) {
    adminKey = key;
    sessionStorage.setItem(STORAGE, key);
    $("login").hidden = true;
    $("app").hidden = false;
    $("forget").hidden = false;
    refresh();
  }

  function logOut(message) {
    clearTimeout(timer);
    adminKey = "";
    latest = null;
    sessionStorage.removeItem(STORAGE);
    $("app").hidden = true;
    $("forget").hidden = true;
    $("login").hidden = false;
    $("status").textContent = "Not signed in";
    const problem = $("login-error");
    problem.hidden = !message;
    problem.textContent = message || "";
  }

  function limitValue(text) {
    const t = text.trim().toLowerCase();
    if (t === "") return undefined;
    if (t === "none") return null;
    if (!/^\d+$/.test(t)) throw new Error(`"${text}" is not a number of tokens`);
    return Number(t);
  }

  async function setBudget(event) {
    event.preventDefault();
    const result = $("budget-result");
    result.hidden = false;
    try {
      const amounts = {};
      for (const metric of ["input", "output", "weighted"]) {
        const value = limitValue($(`budget-${metric}`).value);
        if (value !== undefined) amounts[metric] = value;
      }
      const kind = $("budget-kind").value;
      const name = $("budget-name").value.trim();
      const report = await api("PUT", `/admin/budgets/${kind}/${encodeURIComponent(name)}`,
        { limits: { [$("budget-period").value]: amounts } });
      result.textContent = `Set: ${report.scope}`;
      result.classList.remove("error");
      refresh();
    } catch (error) {
      if (error instanceof Refused) return logOut("The proxy refused that admin key.");
      result.textContent = error.message;
      result.classList.add("error");
    }
  }

  async function createKey(event) {
    event.preventDefault();
    const problem = $("key-error");
    problem.hidden = true;
    const body = { team: $("key-team").value.trim() };
    for (const [field, id] of [["name", "key-name"], ["provider", "key-provider"],
      ["upstream_env", "key-env"], ["tenant", "key-tenant"]]) {
      const value = $(id).value.trim();
      if (value) body[field] = value;
    }
    const scopes = [...document.querySelectorAll("#key-form input[name=scopes]:checked")].map((i) => i.value);
    if (scopes.length) body.scopes = scopes;
    try {
      const created = await api("POST", "/admin/keys", body);
      $("new-key-text").textContent = created.key;
      $("new-key").hidden = false;
      event.target.reset();
      refresh();
    } catch (error) {
      if (error instanceof Refused) return logOut("The proxy refused that admin key.");
      problem.textContent = error.message;
      problem.hidden = false;
    }
  }

  async function revokeKey(event) {
    const id = event.target.dataset && event.target.dataset.revoke;
    if (!id || !window.confirm(`Revoke key ${id}? Requests with it will get 401.`)) return;
    try {
      await api("DELETE", `/admin/keys/${encodeURIComponent(id)}`);
      refresh();
    } catch (error) {
      if (error instanceof Refused) return logOut("The proxy refused that admin key.");
      $("status").textContent = `Could not revoke ${id}: ${error.message}`;
    }
  }

  function keyFromFragment() {
    const found = /(?:^#|&)admin_key=([^&]+)/.exec(window.location.hash);
    if (!found) return "";
    // Drop the fragment at once so the key stays out of the history and screenshots.
    window.history.replaceState(null, "", window.location.pathname + window.location.search);
    return decodeURIComponent(found[1]);
  }

  function start() {
    $("login-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const key = $("admin-key").value.trim();
      $("admin-key").value = "";
      if (key) logIn(key);
    });
    $("forget").addEventListener("click", () => logOut(""));
    $("budget-form").addEventListener("submit", setBudget);
    $("key-form").addEventListener("submit", createKey);
    $("keys").addEventListener("click", revokeKey);
    $("new-key-done").addEventListener("click", () => {
      $("new-key-text").textContent = "";
      $("new-key").hidden = true;
    });
    for (const id of ["window", "series"]) $(id).addEventListener("change", render);
    let resizing = 0;
    window.addEventListener("resize", () => {
      clearTimeout(resizing);
      resizing = setTimeout(render, 150);
    });
    const key = keyFromFragment() || sessionStorage.getItem(STORAGE) || "";
    if (key) logIn(key);
    else logOut("");
  }

  start();
})();
