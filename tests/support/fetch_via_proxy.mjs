// Node's own fetch (undici, as bundled with Node) through an HTTP proxy, the way undici's ProxyAgent goes:
// a CONNECT tunnel to the target, then the request inside it. Node 20 does not expose ProxyAgent, so this
// builds the same thing from the Agent class that fetch itself uses, with a connector that opens the tunnel.
//
//   node fetch_via_proxy.mjs PROXY_PORT METHOD URL [BODY]
// prints {"status", "headers", "body"} as JSON: the answer as fetch decoded it (Content-Encoding undone).
import net from "node:net";

const [proxyPort, method, url, body] = process.argv.slice(2);

await fetch("data:,").catch(() => {}); // makes fetch create its global dispatcher, an undici Agent
const Agent = globalThis[Symbol.for("undici.globalDispatcher.1")].constructor;

function connectThroughProxy(opts, callback) {
  let done = false;
  const finish = (err, socket) => {
    if (!done) {
      done = true;
      callback(err, socket);
    }
  };
  const target = `${opts.hostname}:${opts.port || (opts.protocol === "https:" ? 443 : 80)}`;
  const socket = net.connect(Number(proxyPort), "127.0.0.1");
  let head = Buffer.alloc(0);
  const onData = (chunk) => {
    head = Buffer.concat([head, chunk]);
    const end = head.indexOf("\r\n\r\n");
    if (end < 0) return;
    socket.off("data", onData);
    socket.off("error", onError);
    const status = head.subarray(0, end).toString("latin1").split(" ")[1];
    if (status !== "200") return finish(new Error(`proxy refused CONNECT: ${status}`));
    finish(null, socket);
  };
  const onError = (err) => finish(err);
  socket.on("data", onData);
  socket.on("error", onError);
  socket.once("connect", () => socket.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n\r\n`));
}

const dispatcher = new Agent({ connect: connectThroughProxy });
const init = { method, dispatcher, headers: { "content-type": "application/json" } };
if (body !== undefined) init.body = body;
const response = await fetch(url, init);
const text = await response.text();
console.log(JSON.stringify({ status: response.status, headers: Object.fromEntries(response.headers), body: text }));
await dispatcher.close();
