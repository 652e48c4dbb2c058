# A dataflow from one PostgreSQL table to another, masking card numbers.
terraform {
  required_providers {
    sless = { source = "kube5s/sless" }
  }
}

provider "sless" {}

variable "dsn" {
  type    = string
  default = "postgres://postgres@127.0.0.1:5432/test"
}

resource "sless_dataflow" "orders" {
  name = "orders-to-dwh"
  source = {
    type   = "postgresql"
    config = jsonencode({ connectionString = var.dsn, table = "orders" })
  }
  sink = {
    type   = "postgresql"
    config = jsonencode({ connectionString = var.dsn, table = "orders_copy", autoCreateTable = true })
  }
  transformations = [
    { type = "mask", config = jsonencode({ fields = ["card"], keepLength = true }) },
  ]
}

output "phase" {
  value = sless_dataflow.orders.phase
}
