// An event bus whose subscribers are added per request and never removed: subscribe() adds a
// listener closing over the request's context to a long-lived emitter (held growth in the V8 heap).
// node nodebus.js RATE
const { EventEmitter } = require("events");

const bus = new EventEmitter();
bus.setMaxListeners(0);

function subscribe(n) {
  const context = { id: n, payload: "c".repeat(600), seen: [] };
  bus.on("price", (p) => context.seen.push(p));
}

const rate = Number(process.argv[2] || 1000);
let n = 0;
console.log(`ready ${process.pid}`);
setInterval(() => {
  for (let i = 0; i < rate / 50; i++) subscribe(n++);
}, 20);
