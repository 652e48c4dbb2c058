// Every SQS action the JavaScript SDK v3 offers that sless serves, against
// an endpoint exactly as sless publishes it. Prints one JSON object:
// {"<Command>": "ok" | "<error name>: <message>", ...}.
//   node sqs_calls.mjs ENDPOINT ACCESS_KEY SECRET_KEY REGION
import * as sqs from "@aws-sdk/client-sqs";

const [endpoint, accessKeyId, secretAccessKey, region] = process.argv.slice(2);
const client = new sqs.SQSClient({
  endpoint,
  region,
  credentials: { accessKeyId, secretAccessKey },
  maxAttempts: 1,
});
const results = {};
const suffix = Math.random().toString(36).slice(2, 10);
let queueUrl, dlqUrl, dlqArn, receipt;

async function call(name, command, after) {
  try {
    const out = await client.send(command);
    if (after) after(out);
    results[name] = "ok";
  } catch (e) {
    results[name] = `${e.name}: ${e.message}`;
  }
}

await call("CreateQueue", new sqs.CreateQueueCommand({ QueueName: `js-${suffix}`, tags: { team: "js" } }),
  (o) => { queueUrl = o.QueueUrl; });
await call("CreateQueue(dlq)", new sqs.CreateQueueCommand({ QueueName: `js-dlq-${suffix}` }),
  (o) => { dlqUrl = o.QueueUrl; });
await call("GetQueueUrl", new sqs.GetQueueUrlCommand({ QueueName: `js-${suffix}` }),
  (o) => { if (o.QueueUrl !== queueUrl) throw new Error(`${o.QueueUrl} != ${queueUrl}`); });
await call("ListQueues", new sqs.ListQueuesCommand({ QueueNamePrefix: `js-${suffix}` }),
  (o) => { if (!o.QueueUrls.includes(queueUrl)) throw new Error("not listed"); });
await call("GetQueueAttributes", new sqs.GetQueueAttributesCommand({ QueueUrl: dlqUrl, AttributeNames: ["QueueArn"] }),
  (o) => { dlqArn = o.Attributes.QueueArn; });
await call("SetQueueAttributes", new sqs.SetQueueAttributesCommand({
  QueueUrl: queueUrl,
  Attributes: { VisibilityTimeout: "5", RedrivePolicy: JSON.stringify({ deadLetterTargetArn: dlqArn, maxReceiveCount: 5 }) },
}));
await call("TagQueue", new sqs.TagQueueCommand({ QueueUrl: queueUrl, Tags: { env: "test" } }));
await call("ListQueueTags", new sqs.ListQueueTagsCommand({ QueueUrl: queueUrl }),
  (o) => { if (o.Tags.env !== "test" || o.Tags.team !== "js") throw new Error(JSON.stringify(o.Tags)); });
await call("UntagQueue", new sqs.UntagQueueCommand({ QueueUrl: queueUrl, TagKeys: ["env"] }));
await call("ListDeadLetterSourceQueues", new sqs.ListDeadLetterSourceQueuesCommand({ QueueUrl: dlqUrl }),
  (o) => { if (!o.queueUrls.includes(queueUrl)) throw new Error(JSON.stringify(o)); });
await call("SendMessage", new sqs.SendMessageCommand({
  QueueUrl: queueUrl, MessageBody: "héllo ✓",
  MessageAttributes: { kind: { DataType: "String", StringValue: "greeting" } },
}));
await call("SendMessageBatch", new sqs.SendMessageBatchCommand({
  QueueUrl: queueUrl,
  Entries: [1, 2, 3].map((i) => ({ Id: `m${i}`, MessageBody: `batch ${i}` })),
}), (o) => { if ((o.Successful || []).length !== 3) throw new Error(JSON.stringify(o)); });
await call("ReceiveMessage", new sqs.ReceiveMessageCommand({
  QueueUrl: queueUrl, MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
  MessageAttributeNames: ["All"], MessageSystemAttributeNames: ["All"],
}), (o) => {
  if ((o.Messages || []).length !== 4) throw new Error(`${(o.Messages || []).length} messages`);
  const hello = o.Messages.find((m) => m.Body === "héllo ✓");
  if (!hello || hello.MessageAttributes.kind.StringValue !== "greeting") throw new Error("attributes lost");
  receipt = o.Messages.map((m) => m.ReceiptHandle);
});
await call("ChangeMessageVisibility", new sqs.ChangeMessageVisibilityCommand({
  QueueUrl: queueUrl, ReceiptHandle: receipt[0], VisibilityTimeout: 10,
}));
await call("ChangeMessageVisibilityBatch", new sqs.ChangeMessageVisibilityBatchCommand({
  QueueUrl: queueUrl, Entries: [{ Id: "a", ReceiptHandle: receipt[1], VisibilityTimeout: 10 }],
}), (o) => { if ((o.Failed || []).length) throw new Error(JSON.stringify(o.Failed)); });
await call("DeleteMessage", new sqs.DeleteMessageCommand({ QueueUrl: queueUrl, ReceiptHandle: receipt[0] }));
await call("DeleteMessageBatch", new sqs.DeleteMessageBatchCommand({
  QueueUrl: queueUrl, Entries: [{ Id: "b", ReceiptHandle: receipt[1] }, { Id: "c", ReceiptHandle: receipt[2] }],
}), (o) => { if ((o.Successful || []).length !== 2) throw new Error(JSON.stringify(o)); });
await call("PurgeQueue", new sqs.PurgeQueueCommand({ QueueUrl: queueUrl }));
await call("GetQueueAttributes(All)", new sqs.GetQueueAttributesCommand({ QueueUrl: queueUrl, AttributeNames: ["All"] }),
  (o) => { if (o.Attributes.VisibilityTimeout !== "5") throw new Error(JSON.stringify(o.Attributes)); });
await call("CreateQueue(fifo)", new sqs.CreateQueueCommand({
  QueueName: `js-${suffix}.fifo`, Attributes: { FifoQueue: "true", ContentBasedDeduplication: "true" },
}));
await call("DeleteQueue", new sqs.DeleteQueueCommand({ QueueUrl: queueUrl }));
await call("DeleteQueue(dlq)", new sqs.DeleteQueueCommand({ QueueUrl: dlqUrl }));
await call("GetQueueUrl(missing)", new sqs.GetQueueUrlCommand({ QueueName: `js-${suffix}-missing` }),
  () => { throw new Error("a missing queue was found"); });
if (results["GetQueueUrl(missing)"].startsWith("QueueDoesNotExist")) results["GetQueueUrl(missing)"] = "ok";
console.log(JSON.stringify(results));
