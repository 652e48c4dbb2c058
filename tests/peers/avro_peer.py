"""The Confluent Python client (confluent-kafka's AvroSerializer and
AvroDeserializer with its SchemaRegistryClient) as a peer of sless's Avro
format: produces records to a topic, or consumes them as JSON lines.

    avro_peer.py produce BROKER REGISTRY TOPIC SCHEMA_JSON < records.jsonl
    avro_peer.py consume BROKER REGISTRY TOPIC COUNT > records.jsonl
"""

import json
import sys

from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext


def produce(broker, registry, topic, schema):
    serializer = AvroSerializer(SchemaRegistryClient({"url": registry}), schema)
    producer = Producer({"bootstrap.servers": broker})
    for line in sys.stdin:
        if not line.strip():
            continue
        record = json.loads(line)
        if "__raw__" in record:
            value = record["__raw__"].encode()
        else:
            value = serializer(record, SerializationContext(topic, MessageField.VALUE))
        producer.produce(topic, value=value)
    producer.flush(30)


def consume(broker, registry, topic, count):
    deserializer = AvroDeserializer(SchemaRegistryClient({"url": registry}))
    consumer = Consumer(
        {"bootstrap.servers": broker, "group.id": "avro-peer", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    seen = 0
    idle = 0
    while seen < count and idle < 60:
        message = consumer.poll(1.0)
        if message is None:
            idle += 1
            continue
        if message.error():
            raise SystemExit(str(message.error()))
        value = deserializer(message.value(), SerializationContext(topic, MessageField.VALUE))
        print(json.dumps(value, sort_keys=True), flush=True)
        seen += 1
    consumer.close()


if __name__ == "__main__":
    command, broker, registry, topic, last = sys.argv[1:6]
    if command == "produce":
        produce(broker, registry, topic, last)
    else:
        consume(broker, registry, topic, int(last))
