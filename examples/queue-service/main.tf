# A queue service whose endpoint and keys come back as outputs.
#   export SLESS_ENDPOINT=... SLESS_TOKEN=...   (printed by `sless dev`)
#   terraform apply
#   python3 ../boto3/send_receive.py
terraform {
  required_providers {
    sless = { source = "kube5s/sless" }
  }
}

provider "sless" {}

resource "sless_queue_service" "main" {
  name      = "production-queues"
  memory_mb = 128
}

output "sqs_endpoint" {
  value = sless_queue_service.main.endpoint
}

output "sqs_access_key" {
  value     = sless_queue_service.main.access_key
  sensitive = true
}

output "sqs_secret_key" {
  value     = sless_queue_service.main.secret_key
  sensitive = true
}
