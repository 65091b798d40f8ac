"""The real-model demo: an OpenAI-SDK calculator agent on SmolLM2-135M-Instruct (`reinforge demo --model`)."""
