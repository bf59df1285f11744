// The review pages' keyboard and clicks. Every action has a key. A decision is one form post
// carrying the page's CSRF token and the view ticket the server signed; the next item then
// comes from /api/item without a reload, and the one after it is fetched ahead.
"use strict";

function post(url, fields) {
  const body = new URLSearchParams(fields);
  return fetch(url, { method: "POST", body, credentials: "same-origin" }).then(async (r) => {
    const data = await r.json().catch(() => ({}));
    if (!r.ok) {
      const error = new Error(data.error || (data.detail && JSON.stringify(data.detail)) || r.statusText);
      error.status = r.status;
      throw error;
    }
    return data;
  });
}

function say(text, ok) {
  const status = document.getElementById("status");
  if (!status) return;
  status.textContent = text;
  status.classList.toggle("ok", Boolean(ok));
}

function queuePage() {
  const body = document.body;
  const stage = document.getElementById("stage");
  const reasons = Array.from(document.querySelectorAll(".reason"));
  const filters = new URLSearchParams(window.location.search);
  filters.delete("item");
  let flicker = null;
  let rejecting = false;
  let busy = false; // a decision or a load is in flight: nothing else is sent
  let last = null; // what undo takes back: {attempt, ticket} of a vote, or {attempt, skip: true}
  if ("scrollRestoration" in history) history.scrollRestoration = "manual";

  const item = () => document.getElementById("item");

  function counters() {
    const el = item() || document.getElementById("done");
    if (!el) return;
    for (const key of ["left", "resolved", "total"]) document.getElementById(key).textContent = el.dataset[key];
    document.getElementById("decide").hidden = !item();
  }

  function prefetch(attempt) {
    if (!attempt) return;
    const q = new URLSearchParams(filters);
    q.set("item", attempt);
    fetch("/api/item?" + q, { credentials: "same-origin" })
      .then((r) => (r.ok ? r.json() : null))
      .then((data) => data && data.images.forEach((src) => (new Image().src = src)))
      .catch(() => {});
  }

  function load(attempt) {
    const q = new URLSearchParams(filters);
    if (attempt) q.set("item", attempt);
    return fetch("/api/item?" + q, { credentials: "same-origin" })
      .then(async (r) => {
        const data = await r.json();
        if (!r.ok) throw new Error(data.error || r.statusText);
        return data;
      })
      .then((data) => {
        stopFlicker();
        body.classList.remove("zoomed", "actual");
        stage.innerHTML = data.html;
        window.scrollTo(0, 0);
        counters();
        showReasons(false);
        prefetch(data.next_attempt);
      });
  }

  function settle(promise) {
    busy = true;
    return promise
      .catch((e) => say(e.message))
      .finally(() => {
        busy = false;
      });
  }

  function decide(decision, reason, note) {
    const el = item();
    if (!el || busy) return;
    say("saving…", true);
    const attempt = el.dataset.attempt;
    settle(
      post("/api/decisions", {
        attempt_id: attempt,
        ticket: el.dataset.ticket,
        csrf: el.dataset.csrf,
        decision,
        reason: reason || "",
        note: note || "",
      })
        .then((res) => {
          last = decision === "skip" ? { attempt, skip: true } : { attempt, ticket: res.ticket };
          document.getElementById("undo").disabled = false;
          let text = decision === "skip" ? "skipped" : `${decision}ed: ${res.state}`;
          if (el.dataset.mode === "audit" && res.gate_verdict) text += ` (the gates said ${res.gate_verdict})`;
          return load().then(() => say(text + " · u undoes it", true));
        })
        .catch((e) => {
          // a stale view (409): show the item as it is now, with why
          if (e.status === 409) return load(attempt).then(() => say(e.message));
          throw e;
        })
    );
  }

  function undo() {
    if (!last || busy) return;
    const taken = last;
    last = null;
    document.getElementById("undo").disabled = true;
    if (taken.skip) return settle(load(taken.attempt).then(() => say("back to the item you skipped", true)));
    say("undoing…", true);
    settle(
      post("/api/undo", { attempt_id: taken.attempt, ticket: taken.ticket || "", csrf: item() ? item().dataset.csrf : "" })
        .then(() => load(taken.attempt))
        .then(() => say("undone: decide this item again", true))
    );
  }

  function showReasons(on) {
    rejecting = on;
    document.getElementById("reasons").hidden = !on;
    if (!on) document.getElementById("note-label").hidden = true;
  }

  function chooseReason(code) {
    if (code === "other") {
      document.getElementById("note-label").hidden = false;
      document.getElementById("note").focus();
      return;
    }
    decide("reject", code);
  }

  function stopFlicker() {
    if (!flicker) return;
    clearInterval(flicker);
    flicker = null;
    body.classList.remove("flicker");
    const source = document.getElementById("pane-source");
    const candidate = document.getElementById("pane-candidate");
    if (source) source.style.display = candidate.style.display = "";
  }

  function toggleFlicker() {
    if (flicker) return stopFlicker();
    const source = document.getElementById("pane-source");
    const candidate = document.getElementById("pane-candidate");
    // one pane, alternating source and candidate in the same place every 400 ms
    body.classList.add("flicker");
    let showSource = true;
    candidate.style.display = "none";
    flicker = setInterval(() => {
      showSource = !showSource;
      source.style.display = showSource ? "" : "none";
      candidate.style.display = showSource ? "none" : "";
    }, 400);
  }

  function toggle(id) {
    const pane = document.getElementById(id);
    pane.hidden = !pane.hidden;
    return !pane.hidden;
  }

  function drawZoom() {
    const [x0, y0, x1, y1] = item().dataset.zoom.split(",").map(Number);
    for (const [canvasId, imgId] of [["zoom-source", "img-source"], ["zoom-candidate", "img-candidate"]]) {
      const canvas = document.getElementById(canvasId);
      const frame = canvas.parentElement.getBoundingClientRect();
      // the face box drawn at the pane's own resolution (at most 4x the photo's pixels)
      const scale = Math.min(4, frame.width / Math.max(1, x1 - x0), frame.height / Math.max(1, y1 - y0));
      canvas.width = Math.max(1, Math.round((x1 - x0) * scale));
      canvas.height = Math.max(1, Math.round((y1 - y0) * scale));
      const ctx = canvas.getContext("2d");
      ctx.imageSmoothingEnabled = false;
      ctx.drawImage(document.getElementById(imgId), x0, y0, x1 - x0, y1 - y0, 0, 0, canvas.width, canvas.height);
    }
  }

  document.getElementById("accept").onclick = () => decide("accept");
  document.getElementById("reject").onclick = () => showReasons(true);
  document.getElementById("skip").onclick = () => decide("skip");
  document.getElementById("undo").onclick = () => undo();
  reasons.forEach((b) => (b.onclick = () => chooseReason(b.dataset.reason)));

  document.addEventListener("keydown", (ev) => {
    if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
    // a held key repeats: it decides once
    if (ev.repeat) return ev.preventDefault();
    const typing = ev.target.tagName === "INPUT" || ev.target.tagName === "SELECT" || ev.target.tagName === "TEXTAREA";
    if (typing) {
      if (ev.target.id === "note" && ev.key === "Enter") {
        ev.preventDefault();
        const note = ev.target.value.trim();
        if (!note) return say("say what is wrong, then Enter");
        decide("reject", "other", note);
      } else if (ev.key === "Escape") {
        ev.target.blur();
        showReasons(false);
      }
      return;
    }
    const key = ev.key;
    if (key === "b") return (window.location.href = "/blind");
    if (key === "u") return undo();
    if (!item()) return;
    if (rejecting && /^[1-9]$/.test(key)) {
      // the digit must not land in the note field that "other" focuses
      ev.preventDefault();
      const button = reasons[Number(key) - 1];
      if (button) chooseReason(button.dataset.reason);
      return;
    }
    if (key === "Escape") {
      document.getElementById("gates-drawer").hidden = true;
      return showReasons(false);
    }
    if (key === "a") decide("accept");
    else if (key === "r") showReasons(true);
    else if (key === "s") decide("skip");
    else if (key === "f") toggleFlicker();
    else if (key === "h") toggle("pane-heat");
    else if (key === "m") body.classList.toggle("mask");
    else if (key === "t") toggle("gates-drawer");
    else if (key === "o") body.classList.toggle("actual");
    else if (key === "z") {
      if (body.classList.toggle("zoomed")) drawZoom();
    }
  });
  counters();
  if (item()) prefetch(item().dataset.next);
}

function blindPage() {
  const trial = document.getElementById("trial");
  let busy = false;
  function answer(edited, x, y) {
    if (busy) return;
    busy = true;
    say("saving…", true);
    const fields = { trial: trial.dataset.trial, csrf: trial.dataset.csrf, answer: edited ? "edited" : "unedited" };
    if (x !== undefined) Object.assign(fields, { x, y });
    post("/api/spot", fields)
      .then(() => window.location.reload())
      .catch((e) => {
        busy = false;
        say(e.message);
      });
  }
  if (trial) {
    const img = document.getElementById("blind-image");
    img.addEventListener("click", (ev) => {
      // the click in the image's own pixels, whatever size the browser draws it at
      const rect = img.getBoundingClientRect();
      const x = ((ev.clientX - rect.left) * img.naturalWidth) / rect.width;
      const y = ((ev.clientY - rect.top) * img.naturalHeight) / rect.height;
      answer(true, x.toFixed(1), y.toFixed(1));
    });
  }
  document.addEventListener("keydown", (ev) => {
    if (ev.ctrlKey || ev.metaKey || ev.altKey || ev.repeat) return;
    if (ev.key === "q") window.location.href = "/queue";
    else if (trial && ev.key === "e") answer(true);
    else if (trial && ev.key === "n") answer(false);
  });
}

if (document.body.dataset.page === "queue") queuePage();
else if (document.body.dataset.page === "blind") blindPage();
