// A Node.js agent with no dependencies: everything it knows comes from the environment the runner
// sets. It makes two chat calls through the gateway and posts its reward to the reward URL.
const base = process.env.OPENAI_BASE_URL;
const key = process.env.OPENAI_API_KEY;
const model = process.env.OPENAI_MODEL;
const task = JSON.parse(process.env.REINFORGE_TASK);

async function chat(messages) {
  const res = await fetch(`${base}/chat/completions`, {
    method: "POST",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${key}` },
    body: JSON.stringify({ model, messages }),
  });
  if (!res.ok) throw new Error(`chat failed: ${res.status} ${await res.text()}`);
  return (await res.json()).choices[0].message;
}

const messages = [{ role: "user", content: task.question }];
const first = await chat(messages);
messages.push({ role: "assistant", content: first.content });
messages.push({ role: "user", content: "Are you sure?" });
const second = await chat(messages);

const reward = second.content.includes(task.expected) ? 1.0 : 0.0;
const res = await fetch(process.env.REINFORGE_REWARD_URL, {
  method: "POST",
  headers: { "Content-Type": "application/json", Authorization: `Bearer ${key}` },
  body: JSON.stringify({ reward }),
});
if (!res.ok) throw new Error(`reward failed: ${res.status} ${await res.text()}`);
console.log(`node agent done, reward ${reward}`);
