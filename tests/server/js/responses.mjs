// The official `openai` npm package against a running frugal-proxy, on /v1/responses: a local
// create, an API create continuing it (previous_response_id), a streamed API answer, and a
// retrieve of what was stored.
// Usage: node responses.mjs BASE_URL   (prints one JSON object with what it saw)
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.argv[2], apiKey: "sk-unused", maxRetries: 0 });
const local = { "x-frugal-min-quality": "0" };
const api = { "x-frugal-route": "api" };
const input = "What is the capital of France?";
const textOf = (response) =>
  response.output
    .filter((item) => item.type === "message")
    .flatMap((item) => item.content.map((part) => part.text ?? ""))
    .join("");

const { data: plain, response } = await client.responses
  .create({ model: "gpt-4o-mini", input, max_output_tokens: 16 }, { headers: local })
  .withResponse();

const followed = await client.responses.create(
  { model: "gpt-4o-mini", input: "And of Italy?", previous_response_id: plain.id },
  { headers: api },
);

const stream = client.responses.stream({ model: "gpt-4o-mini", input }, { headers: api });
let deltas = "";
const sequence = [];
const types = [];
for await (const event of stream) {
  sequence.push(event.sequence_number);
  types.push(event.type);
  if (event.type === "response.output_text.delta") deltas += event.delta;
}
const final = await stream.finalResponse();
const fetched = await client.responses.retrieve(final.id);

console.log(
  JSON.stringify({
    route: response.headers.get("x-frugal-route"),
    text: textOf(plain),
    usage: plain.usage,
    followed_text: textOf(followed),
    followed_previous: followed.previous_response_id,
    local_id: plain.id,
    deltas,
    final_text: textOf(final),
    final_id: final.id,
    sequence,
    first: types[0],
    last: types[types.length - 1],
    fetched_text: textOf(fetched),
    fetched_id: fetched.id,
  }),
);
