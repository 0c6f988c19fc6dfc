"""RabbitMQ: the queue topology (declared in one table), the work message on the wire,
publishing with confirms, the dead-letter record, the AMQP connection.

May import: ``common.core``.
"""
