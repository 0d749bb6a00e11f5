"""The demo's last step: one chat request to `megatron serve` through the OpenAI Python client.

  python demo_chat.py BASE_URL MODEL
"""
import sys

import openai

base_url, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key="unused")
question = "Tell me about the city."
reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}], max_tokens=40,
                                       temperature=0.7, top_p=0.95, seed=1)
print(f"   user:      {question}")
print(f"   assistant: {reply.choices[0].message.content.strip()}")
print(f"   ({reply.usage.prompt_tokens} prompt tokens, {reply.usage.completion_tokens} completion tokens, "
      f"finish_reason {reply.choices[0].finish_reason})")
