// The official `openai` npm package against a running frugal-proxy: a plain and a streamed chat.
// Usage: node chat.mjs BASE_URL   (prints one JSON object with what it saw)
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.argv[2], apiKey: "sk-unused", maxRetries: 0 });
const messages = [{ role: "user", content: "What is the capital of France?" }];
const headers = { "x-frugal-min-quality": "0" };

const { data: plain, response } = await client.chat.completions
  .create({ model: "gpt-4o-mini", messages, max_tokens: 16 }, { headers })
  .withResponse();

const stream = await client.chat.completions.create(
  {
    model: "gpt-4o-mini",
    messages,
    max_tokens: 16,
    stream: true,
    stream_options: { include_usage: true },
  },
  { headers },
);
let streamed = "";
let usage = null;
for await (const chunk of stream) {
  streamed += chunk.choices[0]?.delta?.content ?? "";
  if (chunk.usage) usage = chunk.usage;
}

let error = null;
try {
  await client.chat.completions.create({ model: "gpt-4o-mini", messages, temperature: 9 });
} catch (err) {
  error = { name: err.constructor.name, status: err.status, param: err.param };
}

console.log(
  JSON.stringify({
    route: response.headers.get("x-frugal-route"),
    reason: response.headers.get("x-frugal-reason"),
    content: plain.choices[0].message.content,
    usage: plain.usage,
    streamed,
    stream_usage: usage,
    error,
  }),
);
