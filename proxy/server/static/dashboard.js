// The savings page. It reads three things, with the tab's client key as Authorization: Bearer:
//   v1/frugal/report?month=M&by=day|model|key   the month (frugal report --format json's object)
//   healthz, metrics                            the live state, every LIVE_EVERY_MS
// Every string from the server reaches the page through textContent (el() below), never as
// markup; the page's Content-Security-Policy allows no inline script besides.
"use strict";

(() => {
  const F = FrugalFormat;
  const KEY = "frugal.key";
  const LIVE_EVERY_MS = 5000;
  const REPORT_EVERY_MS = 60000;
  const MONTHS_LISTED = 24;
  const CHART_HEIGHT = 240;
  const $ = (id) => document.getElementById(id);

  class AuthError extends Error {}

  const state = {
    key: readKey(),
    month: monthFromHash() || currentMonth(),
    charts: new Map(),
    sorts: new Map(),
    timers: [],
    tokens: null,
    loads: 0,
    shown: false,
  };

  // -- small helpers -------------------------------------------------------------------------

  function readKey() {
    try {
      return sessionStorage.getItem(KEY);
    } catch {
      return null;
    }
  }

  function storeKey(key) {
    state.key = key;
    try {
      if (key === null) sessionStorage.removeItem(KEY);
      else sessionStorage.setItem(KEY, key);
    } catch {
      // storage refused (a private window's quota): the key lives in this page only
    }
  }

  function el(tag, props = {}, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(props)) {
      if (name === "text") node.textContent = value;
      else if (name === "className") node.className = value;
      else node.setAttribute(name, value);
    }
    node.append(...children);
    return node;
  }

  function moneyNodes(text) {
    return F.moneyParts(text).map((part) =>
      part.minor ? el("span", { className: "minor", text: part.text }) : document.createTextNode(part.text),
    );
  }

  function isNegative(text) {
    const micros = F.micros(text);
    return micros !== null && micros < 0n;
  }

  function currentMonth() {
    return new Date().toISOString().slice(0, 7);
  }

  function monthFromHash() {
    const m = /(?:^#|&)month=(\d{4}-(?:0[1-9]|1[0-2]))(?:&|$)/.exec(location.hash);
    return m ? m[1] : null;
  }

  function shiftMonth(label, by) {
    const [y, m] = label.split("-").map(Number);
    const d = new Date(Date.UTC(y, m - 1 + by, 1));
    return d.toISOString().slice(0, 7);
  }

  function dayTs(iso) {
    const [y, m, d] = iso.split("-").map(Number);
    return Date.UTC(y, m - 1, d) / 1000;
  }

  // -- talking to the proxy ------------------------------------------------------------------

  async function fetchText(path) {
    const headers = { Accept: "application/json" };
    if (state.key) headers.Authorization = `Bearer ${state.key}`;
    let resp;
    try {
      resp = await fetch(path, { headers, cache: "no-store", credentials: "omit" });
    } catch {
      throw new Error("The proxy cannot be reached.");
    }
    if (resp.status === 401) throw new AuthError();
    return { status: resp.status, ok: resp.ok, text: await resp.text() };
  }

  async function report(by) {
    const got = await fetchText(`v1/frugal/report?month=${state.month}&by=${by}`);
    if (!got.ok) {
      let message = `The report failed (HTTP ${got.status}).`;
      try {
        message = JSON.parse(got.text).error.message || message;
      } catch {
        // not OpenAI's error shape: keep the status
      }
      throw new Error(message);
    }
    return F.parseReport(got.text);
  }

  // Whether the proxy is keyless: /healthz tells a caller without a key only its status when
  // the proxy has keys, and everything when it has none.
  async function keyless() {
    try {
      const resp = await fetch("healthz", { cache: "no-store", credentials: "omit" });
      const body = await resp.json();
      return body !== null && typeof body === "object" && "engine" in body;
    } catch {
      return false;
    }
  }

  // -- the two screens -----------------------------------------------------------------------

  function showLogin(message) {
    stopTimers();
    clearBoard();
    state.shown = false;
    $("loading").hidden = true;
    $("board").hidden = true;
    document.querySelector(".months").hidden = true;
    $("sign-out").hidden = true;
    $("updated").textContent = "";
    $("login").hidden = false;
    $("login-error").textContent = message;
    $("key").value = "";
    $("key").focus();
  }

  function openBoard() {
    $("login").hidden = true;
    $("login-error").textContent = "";
    $("loading").hidden = state.shown;
    document.querySelector(".months").hidden = false;
    $("sign-out").hidden = !state.key;
    fillMonths();
    stopTimers();
    loadMonth();
    pollLive();
    state.timers.push(setInterval(pollLive, LIVE_EVERY_MS));
    state.timers.push(
      setInterval(() => {
        if (state.month === currentMonth() && !document.hidden) loadMonth();
      }, REPORT_EVERY_MS),
    );
  }

  function stopTimers() {
    for (const t of state.timers) clearInterval(t);
    state.timers = [];
    state.tokens = null;
  }

  function clearBoard() {
    for (const chart of state.charts.values()) chart.destroy();
    state.charts.clear();
    const board = $("board");
    board.removeAttribute("data-month");
    for (const node of board.querySelectorAll("[data-usd]")) {
      node.dataset.usd = "";
      node.replaceChildren();
    }
    for (const id of ["requests", "local-share", "failed", "tax", "warnings", "live", "quality", "quality-why", "period"]) {
      $(id).replaceChildren();
    }
    for (const node of board.querySelectorAll(".table, .chart")) node.replaceChildren();
    $("loss").hidden = true;
  }

  function failed(err) {
    if (err instanceof AuthError) {
      const had = state.key !== null;
      if (!had && !$("login").hidden) return; // another call's 401 has asked already
      storeKey(null);
      showLogin(had ? "This key was not accepted by the proxy. Enter a client key of this proxy." : "");
      return;
    }
    $("loading").hidden = true;
    const banner = $("error");
    banner.textContent = err.message;
    banner.hidden = false;
    if (!state.shown) $("board").hidden = false;
  }

  // -- the month -----------------------------------------------------------------------------

  function fillMonths() {
    const select = $("month");
    const now = currentMonth();
    const latest = state.month > now ? state.month : now;
    const labels = [];
    for (let i = 0; i < MONTHS_LISTED; i++) labels.push(shiftMonth(latest, -i));
    if (!labels.includes(state.month)) labels.push(state.month);
    select.replaceChildren(...labels.map((label) => el("option", { value: label, text: F.monthName(label) })));
    select.value = state.month;
    $("next-month").disabled = state.month >= now;
  }

  function chooseMonth(label) {
    if (!/^\d{4}-\d{2}$/.test(label) || label === state.month) return;
    state.month = label;
    history.replaceState(null, "", `#month=${label}`);
    fillMonths();
    loadMonth();
  }

  async function loadMonth() {
    const load = ++state.loads;
    const month = state.month;
    $("board").setAttribute("aria-busy", "true");
    try {
      const [days, models, keys] = await Promise.all([report("day"), report("model"), report("key")]);
      if (load !== state.loads) return; // a later choice of month won
      $("error").hidden = true;
      $("loading").hidden = true;
      $("board").hidden = false; // before drawing: a hidden chart's box has no width
      render(days, models, keys);
      $("board").dataset.month = month;
      $("board").setAttribute("aria-busy", "false");
      $("updated").textContent = `Report read at ${F.clock(new Date())}`;
      state.shown = true;
    } catch (err) {
      if (load === state.loads) failed(err);
    }
  }

  // -- the report ----------------------------------------------------------------------------

  function setMoney(id, text) {
    const node = $(id);
    node.dataset.usd = text;
    node.replaceChildren(...moneyNodes(text));
  }

  function render(r, models, keys) {
    const thisMonth = r.month === currentMonth();
    $("period").textContent = F.monthName(r.month) + (thisMonth ? ", so far" : "");
    for (const [id, field] of [
      ["net", "net_saved_usd"],
      ["paid", "api_cost_usd"],
      ["counterfactual", "counterfactual_cost_usd"],
      ["saved", "saved_usd"],
      ["fixed", "fixed_cost_usd"],
    ]) {
      setMoney(id, r[field]);
    }
    const losing = isNegative(r.net_saved_usd);
    $("net").classList.toggle("negative", losing);
    const loss = $("loss");
    loss.hidden = !losing;
    loss.replaceChildren(
      ...(losing
        ? [
            "Losing money: the server's fixed cost is more than the local answers saved. Net ",
            ...moneyNodes(r.net_saved_usd),
            ".",
          ]
        : []),
    );

    const answered = r.local_requests + r.api_requests;
    $("requests").textContent = F.integer(r.requests);
    $("local-share").replaceChildren(
      F.percent(r.local_share),
      el("span", { className: "quiet", text: ` ${F.integer(r.local_requests)} of ${F.integer(answered)}` }),
    );
    $("failed").textContent = F.integer(r.failed_requests);
    $("tax").replaceChildren(
      F.seconds(r.latency_tax_s),
      el("span", {
        className: "quiet",
        text: ` over ${F.integer(r.latency_tax_requests)} requests (${F.percent(r.latency_tax_share)}), p95 ${F.seconds(r.latency_tax_p95_s)}`,
      }),
    );
    renderDeferred(r.deferred);
    const notes = [...r.warnings];
    if (r.requests === 0) notes.unshift("No requests were recorded in this month.");
    $("warnings").replaceChildren(...notes.map((w) => el("li", { text: w })));

    renderQuality(r);
    const days = r.groups || [];
    renderShare(days);
    renderSavings(days);
    renderReasons(r);
    renderTax(days);
    renderGroups("models-table", "model", models, r.month);
    renderGroups("keys-table", "key", keys, r.month);
  }

  // Deferred work apart (issue 41): requests that said they can wait, priced at their tier.
  function renderDeferred(d) {
    if (!d || !d.requests) {
      $("deferred").replaceChildren("none in this month");
      return;
    }
    $("deferred").replaceChildren(
      F.integer(d.requests) + " requests, " + F.percent(d.local_share) + " local",
      el("span", { className: "quiet", text: ", paid " }),
      ...moneyNodes(d.api_cost_usd),
      el("span", { className: "quiet", text: ", saved " }),
      ...moneyNodes(d.saved_usd),
    );
  }

  function fact(label, ...value) {
    return el("div", {}, el("dt", { text: label }), el("dd", {}, ...value));
  }

  function renderQuality(r) {
    const facts = [];
    if (!r.audits) {
      facts.push(fact("Audited precision", "no shadow audits in this month"));
    } else {
      const ci = r.audited_precision_ci;
      facts.push(
        fact(
          "Audited precision",
          F.percent(r.audited_precision),
          ci ? el("span", { className: "quiet", text: ` (95% interval ${F.percent(ci[0])} to ${F.percent(ci[1])})` }) : "",
        ),
      );
      facts.push(
        fact(
          "Audits",
          F.integer(r.audits) + (r.audits_failed ? ` (${F.integer(r.audits_failed)} without a verdict)` : ""),
        ),
      );
      facts.push(fact("Accepted by the gate", F.percent(r.acceptance_rate)));
      facts.push(fact("Rejected but right", F.percent(r.rejected_but_correct_share)));
      facts.push(fact("Audits cost", ...moneyNodes(r.audit_cost_usd)));
    }
    const threshold = r.threshold_in_force;
    facts.push(
      fact(
        "Threshold in force",
        threshold === null || threshold === undefined ? "–" : threshold > 1 ? "none accepted" : F.decimal(threshold, 2),
        el("span", { className: "quiet", text: r.threshold_source ? ` (${r.threshold_source})` : "" }),
      ),
    );
    if (r.target_precision) facts.push(fact("Target precision", F.percent(r.target_precision)));
    $("quality").replaceChildren(...facts);
    $("quality-why").textContent = r.threshold_why || "";
  }

  // -- tables --------------------------------------------------------------------------------

  // columns: [{label, kind, get}], kind one of text, int, money, share, seconds, day.
  function cellNode(kind, value) {
    const td = el("td");
    if (value === null || value === undefined) {
      td.className = "none";
      td.textContent = kind === "text" ? "(none)" : "–";
    } else if (kind === "money") {
      td.append(...moneyNodes(value));
      if (isNegative(value)) td.classList.add("negative");
    } else if (kind === "int") {
      td.textContent = F.integer(value);
    } else if (kind === "share") {
      td.textContent = F.percent(value);
    } else if (kind === "seconds") {
      td.textContent = F.seconds(value);
    } else if (kind === "day") {
      td.append(el("time", { datetime: value, text: F.day(value) }));
    } else {
      td.textContent = String(value);
    }
    return td;
  }

  function compare(kind, a, b) {
    if (a === null || a === undefined) return b === null || b === undefined ? 0 : 1;
    if (b === null || b === undefined) return -1;
    if (kind === "money") {
      const x = F.micros(a);
      const y = F.micros(b);
      return x < y ? -1 : x > y ? 1 : 0;
    }
    if (kind === "text") return String(a).localeCompare(String(b), F.locale);
    if (kind === "day") return a < b ? -1 : a > b ? 1 : 0;
    return a - b;
  }

  function table(id, spec) {
    const box = $(id);
    const { caption, columns, rows, footer, file } = spec;
    const sort = state.sorts.get(id);
    const ordered = rows.slice();
    if (sort) {
      const col = columns[sort.column];
      ordered.sort((a, b) => sort.direction * compare(col.kind, col.get(a), col.get(b)));
    }
    const head = el(
      "tr",
      {},
      ...columns.map((col, i) => {
        const th = el("th", { scope: "col" });
        if (sort && sort.column === i) th.setAttribute("aria-sort", sort.direction > 0 ? "ascending" : "descending");
        const button = el("button", { type: "button", text: col.label });
        button.addEventListener("click", () => {
          const now = state.sorts.get(id);
          const numeric = col.kind !== "text" && col.kind !== "day";
          const direction = now && now.column === i ? -now.direction : numeric ? -1 : 1;
          state.sorts.set(id, { column: i, direction });
          table(id, spec);
          box.querySelectorAll("th button")[i].focus();
        });
        th.append(button);
        return th;
      }),
    );
    const body = el(
      "tbody",
      {},
      ...ordered.map((row) => el("tr", {}, ...columns.map((col) => cellNode(col.kind, col.get(row))))),
    );
    const parts = [el("caption", { text: caption }), el("thead", {}, head), body];
    if (footer) parts.push(el("tfoot", {}, el("tr", {}, ...columns.map((col) => cellNode(col.kind, col.get(footer))))));
    const download = el("button", { type: "button", text: "Download CSV" });
    download.addEventListener("click", () => {
      const rowsOut = ordered.map((row) => columns.map((col) => ({ value: col.get(row), kind: col.kind })));
      save(file, F.csv(columns.map((col) => col.label), rowsOut));
    });
    box.replaceChildren(el("div", { className: "table-tools" }, download), el("table", {}, ...parts));
  }

  function save(name, text) {
    const url = URL.createObjectURL(new Blob([text], { type: "text/csv;charset=utf-8" }));
    const a = el("a", { href: url, download: name });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }

  const MONEY_COLUMNS = [
    { label: "Paid (API)", kind: "money", get: (g) => g.api_cost_usd },
    { label: "Without proxy", kind: "money", get: (g) => g.counterfactual_cost_usd },
    { label: "Saved", kind: "money", get: (g) => g.saved_usd },
  ];

  function renderGroups(id, by, r, month) {
    const columns = [
      { label: by === "model" ? "Model" : "Key", kind: "text", get: (g) => g[by] },
      { label: "Requests", kind: "int", get: (g) => g.requests },
      { label: "Local share", kind: "share", get: (g) => g.local_share },
      ...MONEY_COLUMNS,
      { label: "Latency tax", kind: "seconds", get: (g) => g.latency_tax_s },
      { label: "Failed", kind: "int", get: (g) => g.failed_requests },
    ];
    const groups = r.groups || [];
    if (by === "key" && groups.some((g) => g.monthly_budget_usd !== undefined)) {
      columns.push(
        { label: "Monthly budget", kind: "money", get: (g) => g.monthly_budget_usd },
        { label: "Budget used", kind: "share", get: (g) => g.budget_used_share },
      );
    }
    table(id, {
      caption: `${F.monthName(month)}, by ${by === "model" ? "requested model" : "client key (names only)"}`,
      columns,
      rows: groups,
      footer: { [by]: "Total", ...r },
      file: `frugal-${month}-by-${by}.csv`,
    });
  }

  // -- charts --------------------------------------------------------------------------------

  function colors() {
    const css = getComputedStyle(document.documentElement);
    const get = (name) => css.getPropertyValue(name).trim();
    return { fg: get("--quiet"), line: get("--line"), good: get("--good"), bad: get("--bad"), accent: get("--accent") };
  }

  function axes(c, y) {
    return [
      { stroke: c.fg, grid: { stroke: c.line, width: 1 }, ticks: { stroke: c.line, width: 1 } },
      { stroke: c.fg, grid: { stroke: c.line, width: 1 }, ticks: { stroke: c.line, width: 1 }, size: 70, ...y },
    ];
  }

  function draw(id, opts, data) {
    const box = $(id);
    const title = box.closest("section").querySelector("h2").textContent;
    box.setAttribute("role", "img");
    box.setAttribute("aria-label", `Chart: ${title}. Its numbers are in the table next to it.`);
    const old = state.charts.get(id);
    if (old) old.destroy();
    state.charts.delete(id);
    box.replaceChildren();
    if (!data[0].length) {
      box.append(el("p", { className: "quiet", text: "Nothing to draw for this month." }));
      return;
    }
    const chart = new uPlot(
      {
        width: Math.max(280, box.clientWidth),
        height: CHART_HEIGHT,
        tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"),
        cursor: { drag: { x: false, y: false } },
        ...opts,
      },
      data,
      box,
    );
    state.charts.set(id, chart);
  }

  function bars(color) {
    return {
      paths: uPlot.paths.bars({ size: [0.7, 48] }),
      points: { show: false },
      stroke: color,
      fill: color,
      width: 0,
    };
  }

  const usdFloat = (v) =>
    v === null || v === undefined
      ? "–"
      : new Intl.NumberFormat(F.locale, { style: "currency", currency: "USD" }).format(v);
  const dayLabel = (u, ts) => (ts === null || ts === undefined ? "–" : F.day(new Date(ts * 1000).toISOString().slice(0, 10)));

  // A chart and the table of its numbers, side by side: #NAME-chart and #NAME-table.
  function figure(name, chart, data, spec) {
    draw(`${name}-chart`, chart, data);
    table(`${name}-table`, { ...spec, file: `frugal-${state.month}-${name}.csv` });
  }

  // One bar per UTC day: get(day) of each day's report, written by format.
  function dailyBars(days, { label, color, get, format, range }) {
    const c = colors();
    const chart = {
      axes: axes(c, { values: (u, splits) => splits.map(format) }),
      series: [
        { label: "Day", value: dayLabel },
        { label, value: (u, v) => (v === null ? "–" : format(v)), ...bars(c[color]) },
      ],
    };
    if (range) chart.scales = { y: { range } };
    return [chart, [days.map((d) => dayTs(d.day)), days.map(get)]];
  }

  // A daily bar chart and its table: the day, then one column a [label, kind, field] of the
  // day's report.
  function dailyFigure(name, days, spec, caption, columns) {
    figure(name, ...dailyBars(days, spec), {
      caption,
      columns: [
        { label: "Day", kind: "day", get: (d) => d.day },
        ...columns.map(([label, kind, field]) => ({ label, kind, get: (d) => d[field] })),
      ],
      rows: days,
    });
  }

  function renderShare(days) {
    const percent = (v) => `${F.decimal(v, v % 1 ? 1 : 0)}%`;
    const spec = { label: "Local share", color: "good", get: (d) => d.local_share * 100, format: percent, range: [0, 100] };
    dailyFigure("share", days, spec, "Local share per UTC day", [
      ["Requests", "int", "requests"],
      ["Local", "int", "local_requests"],
      ["Local share", "share", "local_share"],
    ]);
  }

  function renderTax(days) {
    const spec = { label: "Latency tax", color: "bad", get: (d) => d.latency_tax_s, format: F.seconds };
    dailyFigure("tax", days, spec, "Latency tax per UTC day", [
      ["Latency tax", "seconds", "latency_tax_s"],
      ["Requests taxed", "int", "latency_tax_requests"],
      ["Share", "share", "latency_tax_share"],
    ]);
  }

  function renderSavings(days) {
    let saved = 0n;
    let net = 0n;
    const rows = days.map((d) => {
      saved += F.micros(d.saved_usd);
      net += F.micros(d.net_saved_usd);
      return { day: d.day, saved_usd: d.saved_usd, cumulative: F.fromMicros(saved), cumulative_net: F.fromMicros(net) };
    });
    const c = colors();
    const line = (label, stroke, more) => ({ label, stroke, width: 2, points: { show: false }, value: (u, v) => usdFloat(v), ...more });
    const chart = {
      axes: axes(c, { values: (u, splits) => splits.map(usdFloat) }),
      series: [
        { label: "Day", value: dayLabel },
        line("Saved, cumulative", c.good),
        line("Net of the fixed cost", c.accent, { dash: [6, 4] }),
      ],
    };
    const dollars = (field) => rows.map((d) => Number(F.micros(d[field])) / 1e6); // drawing only
    figure("savings", chart, [rows.map((d) => dayTs(d.day)), dollars("cumulative"), dollars("cumulative_net")], {
      caption: "Savings per UTC day, and since the month began",
      columns: [
        { label: "Day", kind: "day", get: (d) => d.day },
        { label: "Saved", kind: "money", get: (d) => d.saved_usd },
        { label: "Saved, cumulative", kind: "money", get: (d) => d.cumulative },
        { label: "Net, cumulative", kind: "money", get: (d) => d.cumulative_net },
      ],
      rows,
    });
  }

  function renderReasons(r) {
    const rows = Object.entries(r.reasons).map(([reason, count]) => ({
      reason,
      count,
      share: r.requests ? count / r.requests : 0,
    }));
    const names = rows.map((row) => row.reason);
    const c = colors();
    const many = names.length > 5;
    const chart = {
      padding: [12, 36, 0, 0], // room for the last slanted name
      scales: { x: { time: false, range: [-0.6, Math.max(names.length - 0.4, 0.4)] } },
      axes: [
        {
          stroke: c.fg,
          grid: { show: false },
          ticks: { show: false },
          splits: () => names.map((_, i) => i),
          values: (u, splits) => splits.map((i) => names[i] ?? ""),
          rotate: many ? -30 : 0,
          size: many ? 90 : 40,
        },
        axes(c, {})[1],
      ],
      series: [
        { label: "Reason", value: (u, i) => names[i] ?? "–" },
        { label: "Requests", value: (u, v) => (v === null ? "–" : F.integer(v)), ...bars(c.accent) },
      ],
    };
    figure("reasons", chart, [rows.map((_, i) => i), rows.map((row) => row.count)], {
      caption: "Requests by routing reason",
      columns: [
        { label: "Reason", kind: "text", get: (row) => row.reason },
        { label: "Requests", kind: "int", get: (row) => row.count },
        { label: "Share", kind: "share", get: (row) => row.share },
      ],
      rows,
    });
  }

  function resizeCharts() {
    for (const [id, chart] of state.charts) {
      chart.setSize({ width: Math.max(280, $(id).clientWidth), height: CHART_HEIGHT });
    }
  }

  // -- live state ----------------------------------------------------------------------------

  function metric(text, name, labels = {}) {
    let total = null;
    for (const line of text.split("\n")) {
      if (!line.startsWith(name)) continue;
      const m = /^([A-Za-z_:][\w:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
      if (!m || m[1] !== name) continue;
      const set = m[2] || "";
      if (!Object.entries(labels).every(([k, v]) => set.includes(`${k}="${v}"`))) continue;
      total = (total ?? 0) + Number(m[3]);
    }
    return total;
  }

  const ENGINE_WORDS = { ready: "up", starting: "starting", restarting: "restarting", failed: "down", stopped: "stopped" };

  async function pollLive() {
    let health;
    let metrics = "";
    try {
      const [h, m] = await Promise.all([fetchText("healthz"), fetchText("metrics")]);
      health = JSON.parse(h.text);
      metrics = m.ok ? m.text : "";
    } catch (err) {
      if (err instanceof AuthError) {
        failed(err);
        return;
      }
      const when = $("live-when");
      when.textContent = `unreachable since ${F.clock(new Date())}`;
      when.className = "state-bad";
      return;
    }
    const stateWord = (text, good) => el("span", { className: good ? "state-good" : "state-bad", text });
    if (!health.engine) {
      // A client key is told the status only: the server's details are for admin keys.
      $("live").replaceChildren(
        fact("Proxy", stateWord(health.status || "?", health.status === "ok")),
        fact("Details", el("span", { className: "quiet", text: "shown to admin keys" })),
      );
      const when = $("live-when");
      when.textContent = `at ${F.clock(new Date())}, every ${LIVE_EVERY_MS / 1000} s`;
      when.className = "quiet";
      return;
    }
    const engine = health.engine;
    const ledger = health.ledger || {};
    const now = performance.now();
    const tokens = metric(metrics, "frugal_local_tokens_total", { kind: "completion" }) ?? 0;
    let rate = "–";
    if (state.tokens && now > state.tokens.at) {
      rate = F.decimal(Math.max(0, tokens - state.tokens.value) / ((now - state.tokens.at) / 1000), 1);
    }
    state.tokens = { at: now, value: tokens };
    const failedRows = ["rows_rejected", "rows_dropped", "rows_lost"].reduce((n, k) => n + (ledger[k] || 0), 0);
    const facts = [
      fact("Proxy", stateWord(health.status || "?", health.status === "ok")),
      fact(
        "Local engine",
        stateWord(ENGINE_WORDS[engine.state] || String(engine.state), engine.state === "ready"),
        engine.restarts ? ` (${F.integer(engine.restarts)} restarts)` : "",
      ),
      fact("Queue", `${F.integer(engine.queue_depth ?? 0)} waiting of ${F.integer(engine.max_queue ?? 0)}`),
      fact("Local tokens/s", rate, el("span", { className: "quiet", text: ` (engine ${F.decimal(engine.decode_tok_s, 1)})` })),
      fact("In flight", F.integer(metric(metrics, "frugal_in_flight_requests") ?? 0)),
      fact("Ledger", stateWord(ledger.state || "?", ledger.state === "ok"), ledger.reason ? ` ${ledger.reason}` : ""),
      fact("Ledger backlog", `${F.integer(ledger.pending ?? 0)} rows`),
      fact(
        "Ledger failed rows",
        stateWord(F.integer(failedRows), failedRows === 0),
        ledger.write_failures ? ` (${F.integer(ledger.write_failures)} failed writes)` : "",
      ),
      fact("API fallback", health.fallback ? health.fallback.mode.replace("_", " ") : "–"),
    ];
    $("live").replaceChildren(...facts);
    const when = $("live-when");
    when.textContent = `at ${F.clock(new Date())}, every ${LIVE_EVERY_MS / 1000} s`;
    when.className = "quiet";
  }

  // -- wiring --------------------------------------------------------------------------------

  async function boot() {
    $("login-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const key = $("key").value.trim();
      if (!key) return;
      if (!/^[\x21-\x7e]+$/.test(key)) {
        showLogin("This key was not accepted by the proxy. Enter a client key of this proxy.");
        return;
      }
      storeKey(key);
      openBoard();
    });
    $("sign-out").addEventListener("click", () => {
      storeKey(null);
      showLogin("");
    });
    $("month").addEventListener("change", (event) => chooseMonth(event.target.value));
    $("prev-month").addEventListener("click", () => chooseMonth(shiftMonth(state.month, -1)));
    $("next-month").addEventListener("click", () => chooseMonth(shiftMonth(state.month, 1)));
    window.addEventListener("hashchange", () => {
      const month = monthFromHash();
      if (month) chooseMonth(month);
    });
    let resizing = null;
    window.addEventListener("resize", () => {
      clearTimeout(resizing);
      resizing = setTimeout(resizeCharts, 150);
    });
    if (!state.key && !(await keyless())) {
      showLogin("");
      return;
    }
    openBoard();
  }

  boot();
})();
