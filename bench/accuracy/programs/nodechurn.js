// A JSON service with steady churn: each request parses and renders a document and keeps nothing
// but the last 256 responses. node nodechurn.js RATE
const recent = new Array(256);
const template = JSON.stringify({ items: Array.from({ length: 40 }, (_, i) => ({ i, name: "item" + i })) });

function handleRequest(n) {
  const doc = JSON.parse(template);
  doc.request = n;
  recent[n % 256] = JSON.stringify(doc);
}

const rate = Number(process.argv[2] || 2000);
let n = 0;
console.log(`ready ${process.pid}`);
setInterval(() => {
  for (let i = 0; i < rate / 50; i++) handleRequest(n++);
}, 20);
