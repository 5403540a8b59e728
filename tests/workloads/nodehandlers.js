// Keeps a handler per request in a long-lived Map nothing deletes from: register() stores a closure
// over the request's state, so V8's heap grows with JavaScript objects the program still references
// (nothing outside V8's heap grows). Run without a perf map: V8's generated code has no names.
// usage: node nodehandlers.js [requests_per_second=2000]
'use strict';

const handlers = new Map();

function register(id) {
  const state = { id, started: Date.now(), note: `request ${id} `.repeat(20) };
  handlers.set(id, () => state.started);
}

const perTick = Math.max(1, Math.floor(Number(process.argv[2] || 2000) / 20));
let n = 0;
setInterval(() => {
  for (let i = 0; i < perTick; i++) register(n++);
}, 50);
console.log(`ready ${process.pid}`);
