// The semsearch search page: plain JS over the JSON API (/info, /fields, /search, /similar,
// /duplicates).
// Every stored value reaches the page through textContent, never as markup.
"use strict";

const $ = (id) => document.getElementById(id);
const NUMBER = /^-?\d+(\.\d+)?$/; // the number literals a filter accepts
const TABS = ["search", "similar", "duplicates"];
const state = { info: null, facets: {}, controller: null, timer: 0, ignored: [] };

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

async function api(path, body, signal) {
  const init = body === undefined ? { signal } : {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body), signal,
  };
  const response = await fetch(path, init);
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(data.error || `${path}: HTTP ${response.status}`);
  return data;
}

// Filters -------------------------------------------------------------------------------------

const quoteName = (name) => '"' + name.replaceAll('"', '""') + '"';
const quoteText = (value) => "'" + String(value).replaceAll("'", "''") + "'";
const literal = (value) => (typeof value === "number" && NUMBER.test(String(value)) ? String(value) : quoteText(value));

function buildFilters(fields, params) {
  const list = $("filter-list");
  list.replaceChildren();
  const own = new Set([...(state.info?.text_fields || []), state.info?.id_field]); // the entry itself
  for (const [name, facet] of Object.entries(fields)) {
    if (own.has(name)) continue;
    if (facet.type !== "text" && facet.min !== null && facet.min !== undefined && facet.min !== facet.max) {
      list.append(rangeFilter(name, facet, params));
    } else if (facet.values && facet.values.length > 1) {
      list.append(selectFilter(name, facet, params));
    }
  }
  $("filters").hidden = !list.children.length;
  // a link made on another index may name fields or values this one does not have: say so
  const taken = new Set(currentFilter().params.map(([key, value]) => `${key}=${value}`));
  state.ignored = [...params].filter(([key, value]) => /^(f|min|max):/.test(key) && !taken.has(`${key}=${value}`))
    .map(([key, value]) => `${key}=${value}`);
}

function selectFilter(name, facet, params) {
  const label = el("label", "filter");
  label.append(el("span", "filter-name", name));
  const select = el("select");
  select.dataset.field = name;
  select.append(new Option(`any (${facet.values.reduce((sum, [, n]) => sum + n, 0)})`, ""));
  facet.values.forEach(([value, count], i) => select.append(new Option(`${value} (${count})`, String(i))));
  const wanted = params.get("f:" + name);
  const chosen = facet.values.findIndex(([value]) => String(value) === wanted);
  if (chosen >= 0) select.value = String(chosen);
  select.addEventListener("change", () => runSearch(0));
  label.append(select);
  return label;
}

function rangeFilter(name, facet, params) {
  const group = el("div", "filter range");
  group.append(el("span", "filter-name", name));
  for (const [end, bound] of [["min", facet.min], ["max", facet.max]]) {
    const input = el("input");
    Object.assign(input, { type: "number", step: "any", placeholder: `${end} ${bound}` });
    input.dataset.field = name;
    input.dataset.end = end;
    input.setAttribute("aria-label", `${name} ${end === "min" ? "at least" : "at most"}`);
    input.value = params.get(`${end}:${name}`) || "";
    input.addEventListener("input", () => runSearch(300));
    group.append(input);
  }
  return group;
}

// The filter as the API reads it, and the same choices as URL parameters.
function currentFilter() {
  const parts = [];
  const params = [];
  for (const select of document.querySelectorAll("#filter-list select")) {
    if (select.value === "") continue;
    const name = select.dataset.field;
    const [value] = state.facets[name].values[Number(select.value)];
    parts.push(`${quoteName(name)} = ${literal(value)}`);
    params.push(["f:" + name, String(value)]);
  }
  for (const input of document.querySelectorAll("#filter-list input")) {
    const text = input.value.trim();
    const valid = text === "" || NUMBER.test(text);
    input.setAttribute("aria-invalid", String(!valid));
    if (!text || !valid) continue;
    parts.push(`${quoteName(input.dataset.field)} ${input.dataset.end === "min" ? ">=" : "<="} ${text}`);
    params.push([`${input.dataset.end}:${input.dataset.field}`, text]);
  }
  return { where: parts.length ? parts.join(" AND ") : null, params };
}

// Search --------------------------------------------------------------------------------------

function writeUrl(query, k, filterParams) {
  const params = new URLSearchParams();
  if (query) params.set("q", query);
  if (k !== "10") params.set("k", k);
  if ($("group-by").value) params.set("group", $("group-by").value);
  if ($("mode").value) params.set("mode", $("mode").value);
  if ($("search-min").value) params.set("min", $("search-min").value);
  for (const [key, value] of filterParams) params.set(key, value);
  const tab = TABS.find((name) => !$(`panel-${name}`).hidden);
  if (tab !== "search") params.set("tab", tab);
  if (tab === "duplicates") params.set("min_score", $("min-score").value);
  const search = params.toString();
  history.replaceState(null, "", search ? `?${search}` : location.pathname);
}

function runSearch(delay) {
  clearTimeout(state.timer);
  state.timer = setTimeout(search, delay);
}

async function search() {
  const query = $("q").value.trim();
  const k = $("k").value;
  const { where, params } = currentFilter();
  writeUrl(query, k, params);
  if (state.controller) state.controller.abort();
  if (!query) {
    $("results").replaceChildren();
    $("status").textContent = "Type a question: results appear as you type.";
    return;
  }
  const controller = (state.controller = new AbortController());
  const started = performance.now();
  $("status").textContent = "Searching…";
  try {
    const group = $("group-by").value;
    const mode = $("mode").value;
    const least = $("search-min").value;
    const body = {
      query, k: Number(k), ...(where ? { where } : {}), ...(group ? { group_by: group } : {}), ...(mode ? { mode } : {}),
      ...(least ? { min_score: Number(least) } : {}),
    };
    const data = await api("/search", body, controller.signal);
    const ms = Math.round(performance.now() - started);
    const status = $("status");
    status.replaceChildren(`${data.hits.length} result${data.hits.length === 1 ? "" : "s"} in ${ms} ms`);
    if (data.hits.length && data.hits[0].answered === false) {
      status.append(" · ", el("strong", "no-answer", "no answer: the best hit is below the index's confidence threshold or the score asked for"));
    }
    if (where) status.append(" · filter ", el("code", "", where));
    if (state.ignored.length) status.append(` · not in this index, ignored: ${state.ignored.join(", ")}`);
    $("results").replaceChildren(...data.hits.map((hit) => renderHit(hit, group, mode)));
  } catch (error) {
    if (error.name === "AbortError") return;
    $("status").textContent = `Error: ${error.message}`;
    $("results").replaceChildren();
  }
}

// What a score is in each search mode: one scale for every question (docs/hybrid.md).
const SCORE_MEANING = {
  dense: "cosine similarity of the question and the entry",
  keyword: "the entry's BM25 over the most BM25 the question's words could give, 0 to 1",
  hybrid: "(1 − w) × cosine similarity + w × share of the question's words the entry holds (w: the index's keyword weight, 0.15 by default)",
};

function scoreBar(score, mode = "dense") {
  const bar = el("div", "score");
  bar.title = `${SCORE_MEANING[mode] || SCORE_MEANING.hybrid}: ${score}`;
  const track = el("span", "track");
  const fill = el("span", "fill");
  fill.style.width = `${Math.max(0, Math.min(1, score)) * 100}%`;
  track.append(fill);
  bar.append(track, el("span", "score-value", score.toFixed(3)));
  return bar;
}

// Grouping: the stored fields whose values repeat (a field with a value per entry groups nothing),
// chosen from the URL's "group" if it names one.
function buildGroups(fields, params) {
  const select = $("group-by");
  for (const [name, facet] of Object.entries(fields)) {
    if (name !== state.info?.id_field && facet.repeats) select.append(new Option(name, name));
  }
  if (Object.hasOwn(fields, params.get("group") || "")) select.value = params.get("group");
}

function renderHit(hit, group, mode) {
  const item = el("li", "hit");
  item.tabIndex = 0;
  const textFields = (state.info && state.info.text_fields) || [];
  const shown = new Set([state.info && state.info.id_field]);
  const stored = textFields.filter((name) => typeof hit.fields[name] === "string" && hit.fields[name]);
  const title = stored.length ? hit.fields[stored[0]] : hit.text;
  stored.forEach((name) => shown.add(name));
  const head = el("div", "hit-head");
  // "default": the mode this index searches in when none is asked, as /info tells it
  head.append(scoreBar(hit.score, mode || state.info?.default_mode || "hybrid"), el("span", "rank", `#${hit.rank}`));
  if (hit.answered !== null && hit.answered !== undefined) head.append(answeredBadge(hit));
  item.append(head, el("h2", "hit-title", title));
  for (const name of stored.slice(1)) item.append(el("p", "hit-body", hit.fields[name]));
  if (hit.others) item.append(el("p", "hit-more", `+${hit.others} more in this ${group}`));
  const chips = el("ul", "chips");
  for (const [name, value] of Object.entries(hit.fields)) {
    if (shown.has(name) || value === null || value === "") continue;
    const text = typeof value === "object" ? JSON.stringify(value) : String(value);
    if (text.length > 80) {
      const block = el("p", "hit-field");
      block.append(el("span", "field-name", name), " ", text);
      item.append(block);
    } else {
      const chip = el("li", "chip");
      chip.dataset.field = name;
      chip.append(el("span", "field-name", name), " ", el("span", "field-value", text));
      chips.append(chip);
    }
  }
  chips.append(el("li", "chip id", hit.id));
  item.append(chips);
  return item;
}

// Whether the index holds an answer: its calibrated rule (with a confidence) or a plain threshold.
function answeredBadge(hit) {
  const sure = typeof hit.confidence === "number" ? ` · confidence ${hit.confidence.toFixed(2)}` : "";
  const badge = el("span", `answered ${hit.answered ? "yes" : "no"}`, (hit.answered ? "answered" : "not answered") + sure);
  badge.title = "By the decision rule calibrated for this index (semsearch calibrate)";
  return badge;
}

// Duplicates ----------------------------------------------------------------------------------

async function findDuplicates(event) {
  event?.preventDefault();
  const input = $("min-score");
  const status = $("duplicates-status");
  const minScore = Number(input.value);
  if (!input.value || !(minScore > 0 && minScore <= 1)) {
    input.setAttribute("aria-invalid", "true");
    status.textContent = "Give a cosine above 0 and at most 1.";
    return;
  }
  input.setAttribute("aria-invalid", "false");
  writeUrl($("q").value.trim(), $("k").value, currentFilter().params);
  status.textContent = "Comparing every entry with every other…";
  try {
    const data = await api(`/duplicates?min_score=${encodeURIComponent(minScore)}&limit=1000`);
    const best = new Map();
    for (const pair of data.pairs) {
      for (const [id, other] of [[pair.a, pair.b], [pair.b, pair.a]]) {
        if (!best.has(id) || best.get(id).score < pair.score) best.set(id, { other, score: pair.score });
      }
    }
    const groups = data.groups.length;
    status.textContent = groups
      ? `${groups} group${groups === 1 ? "" : "s"} of entries that say the same thing (${data.total_pairs} pair${data.total_pairs === 1 ? "" : "s"} at cosine ≥ ${data.min_score})`
      : `No two entries at cosine ≥ ${data.min_score}.`;
    $("duplicate-groups").replaceChildren(...data.groups.map((group) => renderGroup(group, data.texts, best)));
  } catch (error) {
    status.textContent = `Error: ${error.message}`;
    $("duplicate-groups").replaceChildren();
  }
}

function renderGroup(group, texts, best) {
  const item = el("li", "hit group");
  item.tabIndex = 0;
  item.append(el("h2", "hit-title", `${group.length} entries`));
  const members = el("ul", "members");
  for (const id of group) {
    const member = el("li", "member");
    member.dataset.id = id;
    const closest = best.get(id);
    member.append(el("span", "chip id", id), " ", el("span", "member-text", texts[id] ?? ""));
    if (closest) member.append(el("span", "score-value", ` ${closest.score.toFixed(3)} with ${closest.other}`));
    members.append(member);
  }
  item.append(members);
  return item;
}

// Similar sentences ---------------------------------------------------------------------------

async function rankSimilar(event) {
  event.preventDefault();
  const sentence = $("sentence").value.trim();
  const candidates = $("candidates").value.split("\n").map((s) => s.trim()).filter(Boolean);
  const status = $("similar-status");
  if (!sentence || !candidates.length) {
    status.textContent = "Give a sentence and at least one candidate line.";
    return;
  }
  status.textContent = "Ranking…";
  try {
    const data = await api("/similar", { sentence, candidates });
    status.textContent = `${data.hits.length} ranked`;
    $("similar-results").replaceChildren(...data.hits.map((hit) => {
      const item = el("li", "hit");
      item.tabIndex = 0;
      item.append(scoreBar(hit.score), el("p", "hit-title", hit.text));
      return item;
    }));
  } catch (error) {
    status.textContent = `Error: ${error.message}`;
  }
}

// Tabs, keys, start ---------------------------------------------------------------------------

function showTab(name, focus) {
  for (const tab of TABS) {
    const on = tab === name;
    $(`tab-${tab}`).setAttribute("aria-selected", String(on));
    $(`tab-${tab}`).tabIndex = on ? 0 : -1;
    $(`panel-${tab}`).hidden = !on;
  }
  if (focus) $({ search: "q", similar: "sentence", duplicates: "min-score" }[name]).focus();
  const { params } = currentFilter();
  writeUrl($("q").value.trim(), $("k").value, params);
}

function moveThroughResults(event) {
  const shown = TABS.find((name) => !$(`panel-${name}`).hidden);
  const list = $({ search: "results", similar: "similar-results", duplicates: "duplicate-groups" }[shown]);
  const items = [...list.children];
  const at = items.indexOf(document.activeElement);
  if (event.key === "ArrowDown" && (event.target === $("q") || at >= 0)) {
    items[Math.min(at + 1, items.length - 1)]?.focus();
  } else if (event.key === "ArrowUp" && at >= 0) {
    (at === 0 ? $("q") : items[at - 1]).focus();
  } else {
    return;
  }
  event.preventDefault();
}

// The question box grows to show all that was typed (where CSS field-sizing cannot).
function fitQuestion() {
  const box = $("q");
  box.style.height = "auto";
  box.style.height = `${box.scrollHeight + box.offsetHeight - box.clientHeight}px`;
}

function onKey(event) {
  const typing = /^(INPUT|TEXTAREA|SELECT)$/.test(event.target.tagName);
  if (event.key === "/" && !typing) {
    event.preventDefault();
    showTab("search", true);
  } else if (event.key === "Escape" && event.target === $("q")) {
    $("q").value = "";
    fitQuestion();
    runSearch(0);
  } else if (event.key === "Enter" && !event.shiftKey && event.target === $("q")) {
    event.preventDefault(); // the box wraps a long question; Enter searches, as in a search field
    runSearch(0);
  } else if (event.key === "Enter" && event.ctrlKey && event.target === $("candidates")) {
    $("similar-form").requestSubmit();
  } else if (event.target.getAttribute("role") === "tab" && /^Arrow(Left|Right)$/.test(event.key)) {
    const at = TABS.indexOf(event.target.id.replace("tab-", ""));
    const next = TABS[(at + (event.key === "ArrowRight" ? 1 : TABS.length - 1)) % TABS.length];
    showTab(next, false);
    $(`tab-${next}`).focus();
  } else {
    moveThroughResults(event);
  }
}

function showFacts(info) {
  const built = info.updated || info.created;
  const facts = [
    info.description,
    `${info.entries} entries`,
    `${info.index_kind} index`,
    built ? `built ${String(built).replace("T", " ").slice(0, 16)}` : null,
  ];
  const shown = facts.filter(Boolean).map((fact) => el("span", "fact", fact));
  shown.push(el("span", "fact calibration", calibrationFacts(info.calibration)));
  $("facts").replaceChildren(...shown);
}

// The index's "no answer" promise in each mode it has a rule for, as `semsearch info` states it
// (its full record: /info).
function calibrationFacts(rules) {
  if (!rules) return "not calibrated";
  return Object.entries(rules).map(([mode, rule]) => `${calibrationFact(rule)} in ${mode} search`).join("; ");
}

function calibrationFact(rule) {
  const promise = rule.guarantee
    ? `precision ≥ ${rule.target} with ${Math.round(rule.guarantee * 100)}% confidence`
    : `precision ${rule.target} (no guarantee)`;
  const when = rule.created ? `, ${String(rule.created).slice(0, 10)}` : "";
  return `calibrated (${rule.source || "labels"}${when}): ${promise}, coverage ${Number(rule.coverage).toFixed(2)}`;
}

async function start() {
  const params = new URLSearchParams(location.search);
  $("q").value = params.get("q") || "";
  if ([...$("k").options].some((o) => o.value === params.get("k"))) $("k").value = params.get("k");
  if ([...$("mode").options].some((o) => o.value === params.get("mode"))) $("mode").value = params.get("mode");
  if (params.get("min") !== null && Math.abs(Number(params.get("min"))) <= 1) $("search-min").value = params.get("min");
  document.addEventListener("keydown", onKey);
  $("q").addEventListener("input", () => { fitQuestion(); runSearch(200); });
  fitQuestion();
  $("k").addEventListener("change", () => runSearch(0));
  $("group-by").addEventListener("change", () => runSearch(0));
  $("mode").addEventListener("change", () => runSearch(0));
  $("search-min").addEventListener("change", () => runSearch(0));
  $("search-form").addEventListener("submit", (event) => { event.preventDefault(); runSearch(0); });
  $("similar-form").addEventListener("submit", rankSimilar);
  $("clear-filters").addEventListener("click", () => {
    state.ignored = [];
    for (const node of document.querySelectorAll("#filter-list select, #filter-list input")) node.value = "";
    runSearch(0);
  });
  $("duplicates-form").addEventListener("submit", findDuplicates);
  for (const tab of TABS) $(`tab-${tab}`).addEventListener("click", () => showTab(tab, true));
  if (params.get("min_score")) $("min-score").value = params.get("min_score");
  if (TABS.includes(params.get("tab"))) showTab(params.get("tab"), false);
  if (params.get("tab") === "duplicates") findDuplicates();
  try {
    const [info, fields] = await Promise.all([api("/info"), api("/fields")]);
    state.info = info;
    state.facets = fields.fields;
    showFacts(info);
    buildFilters(state.facets, params);
    buildGroups(state.facets, params);
  } catch (error) {
    $("facts").textContent = `Cannot read the index: ${error.message}`;
  }
  search();
}

start();
