// The review pages' keyboard and clicks. Every action has a key; decisions are form posts
// carrying the page's CSRF token, then the page reloads to the next item.
"use strict";

function post(url, fields) {
  const body = new URLSearchParams(fields);
  return fetch(url, { method: "POST", body, credentials: "same-origin" }).then(async (r) => {
    const data = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error(data.error || (data.detail && JSON.stringify(data.detail)) || r.statusText);
    return data;
  });
}

function say(text) {
  const status = document.getElementById("status");
  if (status) status.textContent = text;
}

function queuePage() {
  const item = document.getElementById("item");
  const body = document.body;
  let flicker = null;
  let rejecting = false;
  let otherPending = false;
  const reasons = Array.from(document.querySelectorAll(".reason"));

  function decide(decision, reason, note) {
    if (!item) return;
    say("saving…");
    post("/api/decisions", {
      attempt_id: item.dataset.attempt,
      seen: item.dataset.seen,
      csrf: item.dataset.csrf,
      decision,
      reason: reason || "",
      note: note || "",
    })
      .then(() => window.location.reload())
      .catch((e) => say(e.message));
  }

  function showReasons(on) {
    rejecting = on;
    document.getElementById("reasons").hidden = !on;
    if (!on) {
      otherPending = false;
      document.getElementById("note-label").hidden = true;
    }
  }

  function chooseReason(code) {
    if (code === "other") {
      otherPending = true;
      document.getElementById("note-label").hidden = false;
      document.getElementById("note").focus();
      return;
    }
    decide("reject", code);
  }

  function toggleFlicker() {
    const source = document.getElementById("pane-source");
    const candidate = document.getElementById("pane-candidate");
    if (flicker) {
      clearInterval(flicker);
      flicker = null;
      body.classList.remove("flicker");
      source.style.display = candidate.style.display = "";
      return;
    }
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
    const [x0, y0, x1, y1] = item.dataset.zoom.split(",").map(Number);
    const scale = Math.min(3, 360 / Math.max(1, y1 - y0));
    for (const [canvasId, imgId] of [["zoom-source", "img-source"], ["zoom-candidate", "img-candidate"]]) {
      const canvas = document.getElementById(canvasId);
      canvas.width = Math.round((x1 - x0) * scale);
      canvas.height = Math.round((y1 - y0) * scale);
      const ctx = canvas.getContext("2d");
      ctx.imageSmoothingEnabled = false;
      ctx.drawImage(document.getElementById(imgId), x0, y0, x1 - x0, y1 - y0, 0, 0, canvas.width, canvas.height);
    }
  }

  if (item) {
    document.getElementById("accept").onclick = () => decide("accept");
    document.getElementById("reject").onclick = () => showReasons(true);
    document.getElementById("skip").onclick = () => decide("skip");
    reasons.forEach((b) => (b.onclick = () => chooseReason(b.dataset.reason)));
  }

  document.addEventListener("keydown", (ev) => {
    if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
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
    if (!item) return;
    if (rejecting && /^[1-9]$/.test(key)) {
      // the digit must not land in the note field that "other" focuses
      ev.preventDefault();
      const button = reasons[Number(key) - 1];
      if (button) chooseReason(button.dataset.reason);
      return;
    }
    if (key === "Escape") return showReasons(false);
    if (key === "a") decide("accept");
    else if (key === "r") showReasons(true);
    else if (key === "s") decide("skip");
    else if (key === "f") toggleFlicker();
    else if (key === "h") toggle("pane-heat");
    else if (key === "m") body.classList.toggle("mask");
    else if (key === "z") {
      if (toggle("pane-zoom")) drawZoom();
    }
  });
}

function blindPage() {
  const trial = document.getElementById("trial");
  function answer(edited, x, y) {
    say("saving…");
    const fields = { trial: trial.dataset.trial, csrf: trial.dataset.csrf, answer: edited ? "edited" : "unedited" };
    if (x !== undefined) Object.assign(fields, { x, y });
    post("/api/spot", fields)
      .then(() => window.location.reload())
      .catch((e) => say(e.message));
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
    if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
    if (ev.key === "q") window.location.href = "/queue";
    else if (trial && ev.key === "e") answer(true);
    else if (trial && ev.key === "n") answer(false);
  });
}

if (document.body.dataset.page === "queue") queuePage();
else if (document.body.dataset.page === "blind") blindPage();
